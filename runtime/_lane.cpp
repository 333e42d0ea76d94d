// The native call path of a single-device CPU executable (hloalias.runtime._lane).
//
// A Lane runs one call of an Executable whose call plan (runtime/plan.py,
// _CallPlan) is of the common kind: every user input a plain torch CPU tensor,
// read-only inputs imported zero-copy, written inputs backed by a runtime
// buffer from an earlier call (so XLA writes them in place), the random key
// a PJRT-owned array the executable drew for the call, mutated state
// donated and written in place, every output a result of the program.  It
// executes the plan's step tables (runtime/plan.py, _NativeSteps) row by row:
// one row per input (its source, dtype, shape, strides and flags), per
// argument (a state position or an input row), per check of the results, per
// commit and per output (its geometry), with every operand.  So what a call
// does with each argument and result is decided once, in the plan, from the
// facts the Python path reads; this file has only primitives that decide
// nothing about a call (a tensor checked against its row, a cache or registry
// lookup, a list built from the sources, a result's deletion or address, an
// attribute set, a tensor over a buffer with torch's from_blob), run without
// the interpreter.  The constructor checks every operand's range.
//
// Contract (what keeps it exact):
// - Before the program runs nothing is changed.  Any input or state the lane
//   does not handle (another type, dtype, shape, device, layout, lazy bit,
//   non-contiguous memory, an input eager would refuse to write, an index
//   input holding a value out of the range eager accepts, two inputs
//   whose bytes overlap, no runtime buffer behind a written input, a consumed
//   state buffer, an active dispatch or function mode) returns the `fallback`
//   object: the caller then takes the Python path, which checks everything
//   again and raises the error, copies or re-seats as it always does.
// - After the program ran, results that are not the usual ones (a written
//   input XLA did not write in place, a state buffer still alive because a
//   view of it is held) go to execution.finish_planned, the Python commit,
//   with everything the Python path would pass it.  A failed execution goes
//   to execution.execution_failed, which raises.
// - Every call is a transaction: once the program ran (its donated buffers
//   are gone), any error before the commit is done (KeyboardInterrupt in the
//   wait, a failed attribute write) goes to execution.settle, which
//   completes the commit in Python, and is then raised as it came.
// - The dispatch and the wait are the plan's own (SingleDeviceDispatch's
//   fast-path `entry`, else `run`, and `wait`); the lock is the module's,
//   held as the Python path holds it.
// - ABI_VERSION (a module attribute) numbers the Lane constructor's arguments,
//   what the lane reads of the plan and the executable, and the module's
//   functions (first_changed, first_differing, values_in_range, ...: one added
//   or changed is a new interface too); the runtime uses any part of a build
//   (the Lane, those functions, Waiter, guard_dlpack) only when it carries
//   the number runtime/pjrt.py expects (a stale build takes the Python path,
//   saying why in explain() and in a NativePathWarning).  Bump both
//   together whenever either changes.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/PythonTorchFunctionTLS.h>

#include <ATen/dlpack.h>

#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

// The step tables' op codes: runtime/plan.py's, whose _NativeSteps builds
// the tables (what a call does with each input, argument, check, commit and
// output, with every operand); this file only executes their rows.
enum InputStep { IMPORT = 0, BACKED = 1, KEY = 2 };
enum InputFlag { ZERO_OFFSET = 1, WHOLE_STORAGE = 2, WRITE_REFUSALS = 4 };
enum CheckStep { WROTE_IN_PLACE = 0, TAKEN = 1 };
enum CommitStep { SET_BACKING = 0, SET_SLOT = 1 };

// One input row: where the argument comes from and what the tensor must be.
struct UserInput {
  PyObject* index;  // the @main argument index (a Python int): the key of exe._imports
  Py_ssize_t argument;  // the same index: the input's position in the argument list
  Py_ssize_t leaf;  // the input's position among the call's user inputs
  int source;       // InputStep
  int flags;        // InputFlag, or-ed
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t nbytes;
  Py_ssize_t result;  // BACKED: the result XLA writes into its buffer
  // An index input (runtime/plan.py's _IndexCheck): every element must lie
  // in [low, high), else the call goes to the Python path, which raises
  // IndexRangeError before anything runs.
  bool ranged = false;
  int64_t low = 0;
  int64_t high = 0;
};

// After the program ran: is this the usual result (else the Python commit)?
struct Check {
  int step;  // CheckStep
  Py_ssize_t argument;
  Py_ssize_t result;  // WROTE_IN_PLACE: the result at the input's address
  Py_ssize_t user;    // WROTE_IN_PLACE: the user input's position
};

struct Commit {
  int step;  // CommitStep
  Py_ssize_t argument;
  Py_ssize_t result;
  Py_ssize_t user;  // SET_BACKING: the input row whose runtime buffer takes the result
  PyObject* slot;   // SET_SLOT: the state slot (owned through Lane::held)
  Py_ssize_t state;  // SET_SLOT: the slot's position among the state arrays
};

struct Output {
  Py_ssize_t result;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  PyObject* nbytes;  // a Python int
};

enum OutputMode { SINGLE = 0, TUPLE = 1, UNFLATTEN = 2 };

// See the contract above; runtime/pjrt.py's LANE_ABI_VERSION is the same number.
// 9: the module function first_differing (a build of 8 may lack it).
constexpr long kAbiVersion = 9;

// The Python objects a Lane holds (Lane::refs), by position.
enum {
  EXE, PLAN, UNFLATTEN_FN, LOCK, IMPORTS, BACKINGS, SWEEP_AT, HOST_BACKING,
  REGISTER_BACKING, IMPORT_INPUT, FINISH, FAILED, SETTLE, FALLBACK, WATCH, SYNC, EMPTY_TUPLE, NREFS
};

struct Lane {
  PyObject_HEAD
  // Every Python object the lane holds (also for GC traversal).
  PyObject* refs[NREFS];
  std::vector<UserInput>* users;
  std::vector<Py_ssize_t>* sources;  // per argument: a state position, or -1 - an input row
  bool in_order;  // the sources are the state positions in order, then the input rows in order
  std::vector<std::pair<Py_ssize_t, Py_ssize_t>>* pairs;
  std::vector<Check>* checks;
  std::vector<Commit>* commits;
  std::vector<Output>* outputs;
  std::vector<Py_ssize_t>* donated_state;  // argument positions of donated state
  std::vector<PyObject*>* kept;  // Python ints: the arguments whose pre-call arrays the commit reads
  std::vector<PyObject*>* held;  // objects inside the vectors above (owned)
  int mode;
  bool refill;      // each state argument a slot of its own: the plan's cached list can be refilled
  Py_ssize_t state_count;  // state arguments: the length of the plan's cached state list
  Py_ssize_t calls;
  Py_ssize_t fallbacks;
  Py_ssize_t finished_in_python;
};

PyObject* s_array;
PyObject* s_address;
PyObject* s_nbytes;
PyObject* s_interface;
PyObject* s_consumed_by;
PyObject* s_is_deleted;
PyObject* s_unsafe_buffer_pointer;
PyObject* s_run;
PyObject* s_dispatch;
PyObject* s_entry;
PyObject* s_state_arrays;
PyObject* s_stored_array;
PyObject* s_is_ready;
PyObject* s_block_until_ready;
PyObject* s_wait;
PyObject* s_arguments;
PyObject* s_acquire;
PyObject* s_release;
PyObject* s_calls;
PyObject* s_unreturned;
PyObject* s_ran_results;

bool intern(PyObject** slot, const char* text) {
  *slot = PyUnicode_InternFromString(text);
  return *slot != nullptr;
}

PyObject* call_method0(PyObject* object, PyObject* name) {
  PyObject* args[] = {object};
  return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

// 1 true, 0 false, -1 error.
int is_deleted(PyObject* array) {
  PyObject* result = call_method0(array, s_is_deleted);
  if (result == nullptr) return -1;
  int truth = PyObject_IsTrue(result);
  Py_DECREF(result);
  return truth;
}

// The buffer address of a device array; 0 with an error set on failure.
uintptr_t buffer_address(PyObject* array) {
  PyObject* result = call_method0(array, s_unsafe_buffer_pointer);
  if (result == nullptr) return 0;
  uintptr_t address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(result));
  Py_DECREF(result);
  return address;
}

// A Python attribute read as an integer; -1 with an error set (or on a mismatch of type).
long long int_attribute(PyObject* object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object, name);
  if (value == nullptr) return -1;
  long long result = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
  Py_DECREF(value);
  return result;
}

class HeldLock {
 public:
  explicit HeldLock(PyObject* lock) : lock_(lock) {}
  bool acquire() {
    if (lock_ == Py_None) return true;
    PyObject* result = call_method0(lock_, s_acquire);
    if (result == nullptr) return false;
    Py_DECREF(result);
    held_ = true;
    return true;
  }
  ~HeldLock() {
    if (!held_) return;
    // Release keeps any error being raised.
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* result = call_method0(lock_, s_release);
    if (result == nullptr) {
      PyErr_WriteUnraisable(lock_);
    } else {
      Py_DECREF(result);
    }
    PyErr_Restore(type, value, traceback);
  }

 private:
  PyObject* lock_;
  bool held_ = false;
};

// Owned references, dropped together.
class Refs {
 public:
  Refs() { objects_.reserve(16); }  // a call keeps about a dozen
  ~Refs() {
    for (PyObject* object : objects_) Py_XDECREF(object);
  }
  PyObject* keep(PyObject* object) {
    objects_.push_back(object);
    return object;
  }

 private:
  std::vector<PyObject*> objects_;
};

// A torch CPU tensor over `address`, row-major, which keeps `owner` alive.
PyObject* tensor_over(PyObject* owner, uintptr_t address, const Output& output) {
  Py_INCREF(owner);
  at::Tensor tensor;
  try {
    tensor = at::from_blob(
        reinterpret_cast<void*>(address), output.shape, output.strides,
        [owner](void*) {
          // The last reference may go on any thread, or at exit.
          if (_Py_IsFinalizing()) return;
          PyGILState_STATE state = PyGILState_Ensure();
          Py_DECREF(owner);
          PyGILState_Release(state);
        },
        at::TensorOptions().dtype(output.dtype).device(at::kCPU));
  } catch (const std::exception& error) {
    Py_DECREF(owner);
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  return THPVariable_Wrap(std::move(tensor));
}

// The HostBacking of `array` (runtime/pjrt.py), registered in _BACKINGS, as
// HostBacking.__init__ with ready=True and _register_backing make it.
PyObject* new_backing(Lane* self, PyObject* array, uintptr_t address, PyObject* nbytes) {
  auto* type = reinterpret_cast<PyTypeObject*>(self->refs[HOST_BACKING]);
  PyObject* backing = type->tp_new(type, self->refs[EMPTY_TUPLE], nullptr);
  if (backing == nullptr) return nullptr;
  PyObject* py_address = PyLong_FromUnsignedLongLong(address);
  if (py_address == nullptr || PyObject_SetAttr(backing, s_array, array) < 0 ||
      PyObject_SetAttr(backing, s_address, py_address) < 0 || PyObject_SetAttr(backing, s_nbytes, nbytes) < 0 ||
      PyObject_SetAttr(backing, s_interface, Py_None) < 0) {
    Py_XDECREF(py_address);
    Py_DECREF(backing);
    return nullptr;
  }
  PyObject* registry = self->refs[BACKINGS];
  long long sweep_at = PyLong_AsLongLong(PyList_GET_ITEM(self->refs[SWEEP_AT], 0));
  if (PyDict_GET_SIZE(registry) + 1 >= sweep_at) {
    // The sweep is Python's (_register_backing): it registers and sweeps.
    Py_DECREF(py_address);
    PyObject* args[] = {backing};
    PyObject* done = PyObject_Vectorcall(self->refs[REGISTER_BACKING], args, 1, nullptr);
    if (done == nullptr) {
      Py_DECREF(backing);
      return nullptr;
    }
    Py_DECREF(done);
    return backing;
  }
  PyObject* reference = PyWeakref_NewRef(backing, nullptr);
  int status = reference == nullptr ? -1 : PyDict_SetItem(registry, py_address, reference);
  Py_XDECREF(reference);
  Py_DECREF(py_address);
  if (status < 0) {
    Py_DECREF(backing);
    return nullptr;
  }
  return backing;
}

// A tensor checked against its input row: true when it is a plain strided
// CPU tensor of the row's dtype, shape and strides (a dimension of size 1 is
// never stepped along, an empty tensor has no strides to keep: torch's own
// rule for contiguity) meeting the row's flags.  The row decides; this
// decides nothing of the call.
bool matches(const UserInput& row, PyObject* object, const at::Tensor*& out) {
  if (!THPVariable_CheckExact(object)) return false;
  const at::Tensor& tensor = THPVariable_Unpack(object);
  if (!tensor.defined() || tensor.layout() != at::kStrided || !tensor.device().is_cpu() ||
      tensor.scalar_type() != row.dtype || !tensor.has_storage() || tensor.is_conj() || tensor.is_neg() ||
      tensor._is_zerotensor() || tensor.unsafeGetTensorImpl()->is_python_dispatch()) {
    return false;
  }
  auto sizes = tensor.sizes();
  if (static_cast<size_t>(sizes.size()) != row.shape.size()) return false;
  bool empty = false;
  for (size_t i = 0; i < row.shape.size(); ++i) {
    if (sizes[i] != row.shape[i]) return false;
    empty = empty || sizes[i] == 0;
  }
  if (!empty) {
    auto strides = tensor.strides();
    for (size_t i = 0; i < row.shape.size(); ++i) {
      if (row.shape[i] != 1 && strides[i] != row.strides[i]) return false;
    }
  }
  if ((row.flags & ZERO_OFFSET) && tensor.storage_offset() != 0) return false;
  if ((row.flags & WHOLE_STORAGE) && static_cast<int64_t>(tensor.storage().nbytes()) != row.nbytes) return false;
  if (row.flags & WRITE_REFUSALS) {
    if (tensor.requires_grad() && tensor.is_leaf() && c10::GradMode::is_enabled()) return false;
    if (tensor.is_inference() && !c10::InferenceMode::is_enabled()) return false;
  }
  out = &tensor;
  return true;
}

// Whether every element of `tensor` (row-major and dense: it met its row)
// lies in [low, high): one min/max pass.
template <typename T>
bool values_within(const at::Tensor& tensor, int64_t low, int64_t high) {
  const int64_t count = tensor.numel();
  if (count == 0) return true;
  const T* values = static_cast<const T*>(tensor.const_data_ptr());
  T smallest = values[0], largest = values[0];
  for (int64_t i = 1; i < count; ++i) {
    smallest = values[i] < smallest ? values[i] : smallest;
    largest = values[i] > largest ? values[i] : largest;
  }
  return static_cast<int64_t>(smallest) >= low && static_cast<int64_t>(largest) < high;
}

// An index input's values against its row's range (integer dtypes only:
// the constructor refuses a range on another).
bool within_range(const UserInput& row, const at::Tensor& tensor) {
  switch (row.dtype) {
    case at::ScalarType::Long: return values_within<int64_t>(tensor, row.low, row.high);
    case at::ScalarType::Int: return values_within<int32_t>(tensor, row.low, row.high);
    case at::ScalarType::Short: return values_within<int16_t>(tensor, row.low, row.high);
    case at::ScalarType::Char: return values_within<int8_t>(tensor, row.low, row.high);
    default: return false;
  }
}

PyObject* run_call(Lane* self, PyObject* args, PyObject* kwargs) {
  if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || PyTuple_GET_SIZE(args) != 1) {
    PyErr_SetString(PyExc_TypeError, "Lane takes the user inputs as one sequence");
    return nullptr;
  }
  PyObject* fallback = self->refs[FALLBACK];
  PyObject* leaves = PySequence_Fast(PyTuple_GET_ITEM(args, 0), "user inputs");
  if (leaves == nullptr) return nullptr;
  Refs refs;
  refs.keep(leaves);
  const std::vector<UserInput>& users = *self->users;
  if (PySequence_Fast_GET_SIZE(leaves) != static_cast<Py_ssize_t>(users.size())) {
    ++self->fallbacks;
    return Py_NewRef(fallback);
  }
  PyObject** leaf = PySequence_Fast_ITEMS(leaves);
  // The module's lock first (as the Python path holds it for the whole
  // call): the tensors are read once, under it, and used as read.
  HeldLock lock(self->refs[LOCK]);
  if (!lock.acquire()) return nullptr;
  std::vector<uintptr_t> addresses(users.size());
  std::vector<const at::Tensor*> tensors(users.size());
  try {
    // A dispatch or function mode could see or change tensor operations the
    // Python path makes; it takes such calls.
    if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::impl::torch_function_mode_enabled()) {
      ++self->fallbacks;
      return Py_NewRef(fallback);
    }
    for (size_t j = 0; j < users.size(); ++j) {
      // KEY: the random key, a PJRT-owned array the executable drew for
      // this call (not a tensor, nothing to check or import).
      if (users[j].source == KEY) continue;
      if (!matches(users[j], leaf[users[j].leaf], tensors[j]) ||
          (users[j].ranged && !within_range(users[j], *tensors[j]))) {
        ++self->fallbacks;
        return Py_NewRef(fallback);
      }
      addresses[j] = reinterpret_cast<uintptr_t>(tensors[j]->data_ptr());
    }
  } catch (const std::exception&) {
    ++self->fallbacks;
    return Py_NewRef(fallback);
  }
  // The pairs of input rows whose bytes must not overlap: the Python path
  // decides (and refuses) where they do.  Tensors that met their rows'
  // row-major strides: each covers its byte span exactly.
  for (const auto& [first, second] : *self->pairs) {
    int64_t first_bytes = users[first].nbytes, second_bytes = users[second].nbytes;
    if (first_bytes == 0 || second_bytes == 0) continue;
    if (addresses[first] < addresses[second] + second_bytes && addresses[second] < addresses[first] + first_bytes) {
      ++self->fallbacks;
      return Py_NewRef(fallback);
    }
  }

  PyObject* user_arrays = refs.keep(PyList_New(static_cast<Py_ssize_t>(users.size())));
  if (user_arrays == nullptr) return nullptr;
  std::vector<PyObject*> backings(users.size(), nullptr);  // borrowed: alive while the registry's referent is
  for (size_t j = 0; j < users.size(); ++j) {
    const UserInput& input = users[j];
    PyObject* array = nullptr;
    if (input.source == KEY) {
      array = Py_NewRef(leaf[input.leaf]);
    } else if (input.source == IMPORT) {
      // The import cache (exe._imports): its entry when the same tensor is
      // at the same address, else execution.import_input makes one.
      PyObject* found = PyDict_GetItemWithError(self->refs[IMPORTS], input.index);
      if (found == nullptr && PyErr_Occurred()) return nullptr;
      if (found != nullptr && PyTuple_Check(found) && PyTuple_GET_SIZE(found) == 3 &&
          PyWeakref_GetObject(PyTuple_GET_ITEM(found, 0)) == leaf[input.leaf] &&
          PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(found, 1)) == addresses[j]) {
        array = Py_NewRef(PyTuple_GET_ITEM(found, 2));
      } else {
        if (PyErr_Occurred()) return nullptr;
        PyObject* call_args[] = {input.index, leaf[input.leaf]};
        array = PyObject_Vectorcall(self->refs[IMPORT_INPUT], call_args, 2, nullptr);
        if (array == nullptr) return nullptr;
      }
    } else {
      // BACKED: the runtime buffer registered at the tensor's address
      // (ownership._BACKINGS), alive, not taken, of the row's bytes.
      PyObject* address = refs.keep(PyLong_FromUnsignedLongLong(addresses[j]));
      if (address == nullptr) return nullptr;
      PyObject* reference = PyDict_GetItemWithError(self->refs[BACKINGS], address);
      if (reference == nullptr && PyErr_Occurred()) return nullptr;
      PyObject* backing = reference != nullptr && PyWeakref_CheckRef(reference) ? PyWeakref_GetObject(reference) : Py_None;
      if (backing == Py_None) {
        ++self->fallbacks;
        return Py_NewRef(fallback);
      }
      refs.keep(Py_NewRef(backing));
      array = PyObject_GetAttr(backing, s_array);
      if (array == nullptr) return nullptr;
      refs.keep(array);
      int deleted = is_deleted(array);
      if (deleted < 0) return nullptr;
      long long nbytes = int_attribute(backing, s_nbytes);
      if (nbytes < 0 && PyErr_Occurred()) return nullptr;
      if (deleted || nbytes != input.nbytes) {
        ++self->fallbacks;
        return Py_NewRef(fallback);
      }
      backings[j] = backing;
      Py_INCREF(array);
    }
    PyList_SET_ITEM(user_arrays, static_cast<Py_ssize_t>(j), array);
  }
  // The argument list, row by row of the sources table (_CallPlan.sources,
  // which _CallPlan.arguments reads too): the plan's cached state arrays
  // and the user arrays.  With no cached list (a slot's buffer was replaced
  // since), _CallPlan.arguments builds it and fills the cache.
  PyObject* arrays;
  PyObject* state = nullptr;
  if (self->state_count > 0) {
    state = refs.keep(PyObject_GetAttr(self->refs[PLAN], s_state_arrays));
    if (state == nullptr) return nullptr;
  }
  if (self->state_count == 0 && self->in_order) {
    arrays = user_arrays;  // the sources' list: the input rows in order
  } else if (self->state_count == 0 || (PyList_Check(state) && PyList_GET_SIZE(state) == self->state_count)) {
    const std::vector<Py_ssize_t>& sources = *self->sources;
    const Py_ssize_t count = static_cast<Py_ssize_t>(sources.size());
    arrays = refs.keep(PyList_New(count));
    if (arrays == nullptr) return nullptr;
    if (self->in_order) {  // the same list, without reading the table
      for (Py_ssize_t i = 0; i < self->state_count; ++i) {
        PyList_SET_ITEM(arrays, i, Py_NewRef(PyList_GET_ITEM(state, i)));
      }
      for (Py_ssize_t i = self->state_count; i < count; ++i) {
        PyList_SET_ITEM(arrays, i, Py_NewRef(PyList_GET_ITEM(user_arrays, i - self->state_count)));
      }
    } else {
      for (Py_ssize_t i = 0; i < count; ++i) {
        Py_ssize_t source = sources[i];
        PyObject* item = source >= 0 ? PyList_GET_ITEM(state, source) : PyList_GET_ITEM(user_arrays, -1 - source);
        PyList_SET_ITEM(arrays, i, Py_NewRef(item));
      }
    }
  } else {
    PyObject* arguments_args[] = {self->refs[PLAN], self->refs[EXE], user_arrays};
    arrays = refs.keep(
        PyObject_VectorcallMethod(s_arguments, arguments_args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    if (arrays == nullptr) return nullptr;
  }
  if (!PyList_Check(arrays) || PyList_GET_SIZE(arrays) != static_cast<Py_ssize_t>(self->sources->size())) {
    PyErr_SetString(PyExc_TypeError, "_CallPlan.arguments returned no list of the plan's arguments");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arrays); ++i) {
    if (PyList_GET_ITEM(arrays, i) == Py_None) {  // a consumed state buffer: the Python path names it
      ++self->fallbacks;
      return Py_NewRef(fallback);
    }
  }
  // The donated state arguments must be distinct buffers (the row's
  // positions); one buffer twice (tied state both written): the Python
  // path refuses it (execution._check_donated_state).
  const std::vector<Py_ssize_t>& donated = *self->donated_state;
  for (size_t a = 0; a < donated.size(); ++a) {
    for (size_t b = a + 1; b < donated.size(); ++b) {
      if (PyList_GET_ITEM(arrays, donated[a]) == PyList_GET_ITEM(arrays, donated[b])) {
        ++self->fallbacks;
        return Py_NewRef(fallback);
      }
    }
  }

  // Run and wait, through the plan's dispatch (read on each call, as the
  // Python path reads it).
  PyObject* dispatch = refs.keep(PyObject_GetAttr(self->refs[PLAN], s_dispatch));
  if (dispatch == nullptr) return nullptr;
  PyObject* unreturned = refs.keep(PyObject_GetAttr(dispatch, s_unreturned));
  if (unreturned == nullptr) return nullptr;
  if (!PyDict_Check(unreturned)) {
    PyErr_SetString(PyExc_TypeError, "the dispatch's unreturned results are not a dict");
    return nullptr;
  }
  // jaxlib's fast-path function where the dispatch has one (`entry`,
  // called as `run` calls it), else `run`.
  PyObject* entry = PyObject_GetAttr(dispatch, s_entry);
  if (entry == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return nullptr;
    PyErr_Clear();
    entry = Py_NewRef(Py_None);
  }
  refs.keep(entry);
  PyObject* results;
  if (entry != Py_None) {
    results = PyObject_Vectorcall(entry, PySequence_Fast_ITEMS(arrays), PyList_GET_SIZE(arrays), nullptr);
  } else {
    PyObject* run = refs.keep(PyObject_GetAttr(dispatch, s_run));
    if (run == nullptr) return nullptr;
    PyObject* run_args[] = {arrays};
    results = PyObject_Vectorcall(run, run_args, 1, nullptr);
  }
  // The commit of execution.finish_planned (`fn`: it, or settle), with
  // what run_planned would pass it.
  auto commit_in_python = [&](PyObject* fn, PyObject* results_seq) -> PyObject* {
    PyObject* inputs = refs.keep(PyDict_New());
    PyObject* bases = refs.keep(PyDict_New());
    PyObject* backing_map = refs.keep(PyDict_New());
    PyObject* reseatable = refs.keep(PySet_New(nullptr));
    PyObject* kept = refs.keep(PyDict_New());
    if (inputs == nullptr || bases == nullptr || backing_map == nullptr || reseatable == nullptr || kept == nullptr) {
      return nullptr;
    }
    for (size_t j = 0; j < users.size(); ++j) {
      PyObject* value = leaf[users[j].leaf];
      if (PyDict_SetItem(inputs, users[j].index, value) < 0 ||
          (users[j].source != KEY && PyDict_SetItem(bases, users[j].index, value) < 0)) {
        return nullptr;
      }
      if (backings[j] != nullptr && PyDict_SetItem(backing_map, users[j].index, backings[j]) < 0) return nullptr;
    }
    for (PyObject* index : *self->kept) {
      Py_ssize_t position = PyLong_AsSsize_t(index);
      if (PyDict_SetItem(kept, index, PyList_GET_ITEM(arrays, position)) < 0) return nullptr;
    }
    PyObject* commit_args[] = {self->refs[PLAN], inputs, bases, backing_map, reseatable, kept, results_seq};
    return PyObject_Vectorcall(fn, commit_args, 7, nullptr);
  };
  // The program ran and an error stops the call before its commit is done:
  // execution.settle completes it; the error is raised as it came.  The
  // call is counted (exe._calls) once, here if it was not yet: its effects
  // are committed, as run_planned counts a settled call.
  bool counted = false;
  auto settle = [&](PyObject* ran) -> PyObject* {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (!counted) {
      const long long before = int_attribute(self->refs[EXE], s_calls);
      PyObject* after = before < 0 ? nullptr : PyLong_FromLongLong(before + 1);
      if (after != nullptr) PyObject_SetAttr(self->refs[EXE], s_calls, after);
      Py_XDECREF(after);
      PyErr_Clear();
      counted = true;
    }
    PyObject* sequence = PySequence_Fast(ran, "results");
    if (sequence != nullptr) {
      refs.keep(sequence);
      Py_XDECREF(commit_in_python(self->refs[SETTLE], sequence));
    }
    PyErr_Clear();  // settle raises nothing of its own over the call's error
    PyErr_Restore(type, value, traceback);
    return nullptr;
  };
  // The results once the program ran.  A fast-path hit returns here with
  // no signal check between (C calling C); an error out of the dispatch
  // (KeyboardInterrupt inside jaxlib's cache-miss callback, after the
  // execute) leaves them with the dispatch: SingleDeviceDispatch.ran_results
  // says whether the program ran, and forgets them either way.
  PyObject* ran = results;
  bool launched = results != nullptr;
  if (launched) refs.keep(results);
  if (launched && PyDict_GET_SIZE(unreturned) != 0) {
    // A cache miss's results, now with the lane: forgotten without running
    // Python (no point for an interrupt to land).
    PyObject* thread = refs.keep(PyLong_FromUnsignedLong(PyThread_get_thread_ident()));
    if (thread == nullptr || (PyDict_DelItem(unreturned, thread) < 0 && !PyErr_ExceptionMatches(PyExc_KeyError))) {
      return settle(results);
    }
    PyErr_Clear();
  }
  if (launched && self->refs[WATCH] != Py_None) {
    // A program with no effect (nothing donated or written; the plan's
    // effect_free): the check that torch did not change the module's state
    // (Executable._watch_late) runs while it executes.  Changed, or the
    // check failed: the run read the old state and is dropped once it ended
    // (it reads the caller's imported memory until then), the state is
    // brought up to date (`sync`, Executable._sync_from_torch, which may
    // refuse a changed dtype or shape) and the call goes to the Python path,
    // whose run is then the only one; nothing else changed.
    PyObject* changed = PyObject_CallNoArgs(self->refs[WATCH]);
    int truth = changed == nullptr ? -1 : PyObject_IsTrue(changed);
    Py_XDECREF(changed);
    if (truth != 0) {
      PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
      if (truth < 0) PyErr_Fetch(&type, &value, &traceback);
      PyObject* wait_args[] = {dispatch, results};
      Py_XDECREF(PyObject_VectorcallMethod(s_wait, wait_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
      PyErr_Clear();  // the run is dropped, whatever its outcome
      if (truth < 0) {
        PyErr_Restore(type, value, traceback);
        return nullptr;
      }
      PyObject* synced = PyObject_CallNoArgs(self->refs[SYNC]);
      if (synced == nullptr) return nullptr;
      Py_DECREF(synced);
      ++self->fallbacks;
      return Py_NewRef(fallback);
    }
  }
  if (!launched) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* ran_args[] = {dispatch, Py_None};
    PyObject* found = PyObject_VectorcallMethod(s_ran_results, ran_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (found == nullptr) {
      PyErr_WriteUnraisable(dispatch);  // not raised over the call's error
    } else if (found != Py_None && ran == nullptr) {
      ran = refs.keep(found);
      found = nullptr;
    }
    Py_XDECREF(found);
    PyErr_Restore(type, value, traceback);
  }
  if (results != nullptr) {
    PyObject* wait_args[] = {dispatch, results};
    PyObject* waited = PyObject_VectorcallMethod(s_wait, wait_args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    // (`wait` is the dispatch's Waiter where it is native: called as it is.)
    if (waited == nullptr) results = nullptr;
    Py_XDECREF(waited);
  }
  if (results == nullptr) {
    // The program ran and the error is not the execution's own (a
    // KeyboardInterrupt, or any error out of the dispatch after the
    // execute): the call commits before the error leaves.
    bool interrupt = !PyErr_ExceptionMatches(PyExc_Exception);
    if (ran != nullptr && (interrupt || !launched)) {
      settle(ran);
      if (interrupt) return nullptr;
    } else if (interrupt) {
      return nullptr;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != nullptr) PyException_SetTraceback(value, traceback);
    PyObject* failed_args[] = {self->refs[PLAN], value};
    PyObject* none = PyObject_Vectorcall(self->refs[FAILED], failed_args, 2, nullptr);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    Py_XDECREF(none);
    if (none != nullptr) PyErr_SetString(PyExc_RuntimeError, "execution.execution_failed returned");
    return nullptr;
  }
  PyObject* results_fast = refs.keep(PySequence_Fast(results, "results"));
  if (results_fast == nullptr) return settle(results);
  PyObject** result = PySequence_Fast_ITEMS(results_fast);
  Py_ssize_t result_count = PySequence_Fast_GET_SIZE(results_fast);

  // The call ran: counted, as run_planned counts it.
  long long calls = int_attribute(self->refs[EXE], s_calls);
  if (calls < 0) return settle(results_fast);
  PyObject* new_calls = refs.keep(PyLong_FromLongLong(calls + 1));
  if (new_calls == nullptr || PyObject_SetAttr(self->refs[EXE], s_calls, new_calls) < 0) return settle(results_fast);
  counted = true;

  // The usual results?  The plan's check steps, in order.
  bool usual = true;
  for (const Check& check : *self->checks) {
    if (!usual) break;
    if (check.argument >= PyList_GET_SIZE(arrays)) return settle(results_fast);
    int deleted = is_deleted(PyList_GET_ITEM(arrays, check.argument));
    if (deleted < 0) return settle(results_fast);
    usual = deleted != 0;
    if (usual && check.step == WROTE_IN_PLACE) {
      if (check.result >= result_count) return settle(results_fast);
      uintptr_t address = buffer_address(result[check.result]);
      if (PyErr_Occurred()) return settle(results_fast);
      usual = address == addresses[check.user];
    }
  }
  if (!usual) {
    // execution.finish_planned, with what run_planned would pass.
    ++self->finished_in_python;
    PyObject* done = commit_in_python(self->refs[FINISH], results_fast);
    return done != nullptr ? done : settle(results_fast);
  }

  // Commit: the plan's commit steps, in order (nothing fails on valid inputs).
  bool slots_set = false;
  for (const Commit& commit : *self->commits) {
    if (commit.result >= result_count) return settle(results_fast);
    PyObject* value = result[commit.result];
    if (commit.step == SET_BACKING) {
      if (backings[commit.user] == nullptr || PyObject_SetAttr(backings[commit.user], s_array, value) < 0) {
        return settle(results_fast);
      }
    } else {
      if (PyObject_SetAttr(commit.slot, s_array, value) < 0 || PyObject_SetAttr(commit.slot, s_consumed_by, Py_None) < 0) {
        return settle(results_fast);
      }
      slots_set = true;
    }
  }
  if (self->refill && slots_set) {
    // Setting a slot's array dropped the plan's cached list (_StateSlot's
    // readers).  Under the lock the other state arrays are the ones this
    // call read, so the plan's list is this call's (each argument's at its
    // state position) with each new buffer in place: kept for the next
    // call, unless a slot stored another array than the result (its setter
    // reinterprets another dtype's bits).
    PyObject* state_arrays = refs.keep(PyList_New(self->state_count));
    if (state_arrays == nullptr) return settle(results_fast);
    const std::vector<Py_ssize_t>& sources = *self->sources;
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i] >= 0) {
        PyList_SET_ITEM(state_arrays, sources[i], Py_NewRef(PyList_GET_ITEM(arrays, static_cast<Py_ssize_t>(i))));
      }
    }
    bool same = true;
    for (const Commit& commit : *self->commits) {
      if (commit.step != SET_SLOT) continue;
      PyObject* stored = PyObject_GetAttr(commit.slot, s_stored_array);
      if (stored == nullptr) return settle(results_fast);
      same = stored == result[commit.result];
      if (!same) {
        Py_DECREF(stored);
        break;
      }
      PyList_SetItem(state_arrays, commit.state, stored);  // steals
    }
    if (same && PyObject_SetAttr(self->refs[PLAN], s_state_arrays, state_arrays) < 0) return settle(results_fast);
  }
  ++self->calls;

  // The outputs: torch tensors over the runtime's buffers, of each output
  // row's dtype, shape and strides (as _host_result makes them).
  const std::vector<Output>& outputs = *self->outputs;
  PyObject* flat = refs.keep(PyTuple_New(static_cast<Py_ssize_t>(outputs.size())));
  if (flat == nullptr) return nullptr;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Output& output = outputs[k];
    if (output.result >= result_count) return nullptr;
    PyObject* array = result[output.result];
    uintptr_t address = buffer_address(array);
    if (PyErr_Occurred()) return nullptr;
    PyObject* backing = new_backing(self, array, address, output.nbytes);
    if (backing == nullptr) return nullptr;
    PyObject* tensor = tensor_over(backing, address, output);
    Py_DECREF(backing);  // the tensor holds it
    if (tensor == nullptr) return nullptr;
    PyTuple_SET_ITEM(flat, static_cast<Py_ssize_t>(k), tensor);
  }
  if (self->mode == SINGLE) return Py_NewRef(PyTuple_GET_ITEM(flat, 0));
  if (self->mode == TUPLE) return Py_NewRef(flat);
  PyObject* list = refs.keep(PySequence_List(flat));
  if (list == nullptr) return nullptr;
  PyObject* unflatten_args[] = {list};
  return PyObject_Vectorcall(self->refs[UNFLATTEN_FN], unflatten_args, 1, nullptr);
}

PyObject* lane_call(Lane* self, PyObject* args, PyObject* kwargs) {
  // No C++ exception may leave the extension (it would abort the process).
  // Before the program runs they are caught where they arise (a fallback);
  // one from here is torch's, raised as Python's RuntimeError.
  try {
    return run_call(self, args, kwargs);
  } catch (const std::exception& error) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

int lane_clear(Lane* self);

// Lane(exe, plan, inputs, sources, pairs, checks, commits, donated_state, outputs, kept, mode, refill,
//      state_count, unflatten, lock, imports, backings, sweep_at, host_backing, register_backing,
//      import_input, finish, failed, settle, fallback, watch, sync, ranges): the step tables are runtime/plan.py's
//      _NativeSteps (checked here for their operands' ranges); `watch` is the check of the module's
//      tensors run while an effect-free program executes, and `sync` brings the state up to date after
//      it found a change, or both None; `ranges` holds (input row, low, high) per index input; see
//      hloalias.runtime.lane._native_lane.
int lane_init(Lane* self, PyObject* args, PyObject* kwargs) {
  PyObject *exe, *plan, *users, *sources, *pairs, *checks, *commits, *donated, *outputs, *kept, *unflatten, *lock,
      *imports, *backings, *sweep_at, *host_backing, *register_backing, *import_input, *finish, *failed, *settle,
      *fallback, *watch, *sync, *ranges;
  int mode, refill;
  Py_ssize_t state_count;
  if (!PyArg_ParseTuple(args, "OOO!O!O!O!O!O!O!O!ipnOOO!O!O!OOOOOOOOOO!", &exe, &plan, &PyTuple_Type, &users,
                        &PyTuple_Type, &sources, &PyTuple_Type, &pairs, &PyTuple_Type, &checks, &PyTuple_Type,
                        &commits, &PyTuple_Type, &donated, &PyTuple_Type, &outputs, &PyTuple_Type, &kept,
                        &mode, &refill, &state_count, &unflatten, &lock, &PyDict_Type, &imports, &PyDict_Type, &backings, &PyList_Type,
                        &sweep_at, &host_backing, &register_backing, &import_input, &finish, &failed, &settle, &fallback,
                        &watch, &sync, &PyTuple_Type, &ranges)) {
    return -1;
  }
  if (!PyType_Check(host_backing) || PyList_GET_SIZE(sweep_at) != 1 || mode < SINGLE || mode > UNFLATTEN ||
      (watch != Py_None && !PyCallable_Check(watch)) || (watch != Py_None && !PyCallable_Check(sync)) ||
      state_count < 0) {
    PyErr_SetString(PyExc_TypeError, "Lane: malformed arguments");
    return -1;
  }
  lane_clear(self);  // a second __init__ starts from empty tables
  PyObject* empty = PyTuple_New(0);
  if (empty == nullptr) return -1;
  PyObject* given[NREFS] = {exe, plan, unflatten, lock, imports, backings, sweep_at, host_backing,
                            register_backing, import_input, finish, failed, settle, fallback, watch, sync, empty};
  for (int i = 0; i < NREFS; ++i) {
    if (i != EMPTY_TUPLE) Py_INCREF(given[i]);
    Py_XSETREF(self->refs[i], given[i]);
  }
  self->mode = mode;
  self->refill = refill != 0;
  self->state_count = state_count;
  auto hold = [self](PyObject* object) {
    Py_INCREF(object);
    self->held->push_back(object);
    return object;
  };
  auto malformed = [](const char* what) {
    PyErr_Format(PyExc_ValueError, "Lane: a malformed %s row", what);
    return -1;
  };
  auto dtype_of = [](PyObject* object, at::ScalarType& out) {
    if (!THPDtype_Check(object)) {
      PyErr_SetString(PyExc_TypeError, "Lane: expected a torch.dtype");
      return false;
    }
    out = reinterpret_cast<THPDtype*>(object)->scalar_type;
    return true;
  };
  auto shape_of = [](PyObject* object, std::vector<int64_t>& out) {
    PyObject* fast = PySequence_Fast(object, "Lane: a shape");
    if (fast == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
      out.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i)));
    }
    Py_DECREF(fast);
    return !PyErr_Occurred();
  };
  const Py_ssize_t user_count = PyTuple_GET_SIZE(users);
  for (Py_ssize_t i = 0; i < user_count; ++i) {
    PyObject *index, *dtype, *shape, *strides;
    int source, flags;
    long long nbytes;
    Py_ssize_t leaf, result;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(users, i), "O!niiOOOLn", &PyLong_Type, &index, &leaf, &source, &flags,
                          &dtype, &shape, &strides, &nbytes, &result)) {
      return -1;
    }
    Py_ssize_t argument = PyLong_AsSsize_t(index);
    if (argument == -1 && PyErr_Occurred()) return -1;
    if ((source != IMPORT && source != BACKED && source != KEY) || (flags & ~(ZERO_OFFSET | WHOLE_STORAGE | WRITE_REFUSALS)) != 0 ||
        argument < 0 || leaf < 0 || leaf >= user_count || nbytes < 0 || (source == BACKED && result < 0) ||
        (source == KEY && flags != 0)) {
      return malformed("input");
    }
    UserInput input{hold(index), argument, leaf, source, flags, at::ScalarType::Undefined, {}, {}, nbytes, result};
    if (!dtype_of(dtype, input.dtype) || !shape_of(shape, input.shape) || !shape_of(strides, input.strides)) return -1;
    if (input.strides.size() != input.shape.size()) return malformed("input");
    self->users->push_back(std::move(input));
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ranges); ++i) {
    Py_ssize_t row;
    long long low, high;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ranges, i), "nLL", &row, &low, &high)) return -1;
    if (row < 0 || row >= user_count || low > high) return malformed("range");
    UserInput& input = (*self->users)[static_cast<size_t>(row)];
    if (input.ranged || input.source == KEY || (input.dtype != at::ScalarType::Long && input.dtype != at::ScalarType::Int &&
                         input.dtype != at::ScalarType::Short && input.dtype != at::ScalarType::Char)) {
      return malformed("range");
    }
    input.ranged = true;
    input.low = low;
    input.high = high;
  }
  const Py_ssize_t argument_count = PyTuple_GET_SIZE(sources);
  std::vector<int> state_seen(static_cast<size_t>(state_count), 0), user_seen(static_cast<size_t>(user_count), 0);
  for (Py_ssize_t i = 0; i < argument_count; ++i) {
    Py_ssize_t source = PyLong_AsSsize_t(PyTuple_GET_ITEM(sources, i));
    if (source == -1 && PyErr_Occurred()) return -1;
    if (source >= state_count || -1 - source >= user_count) return malformed("source");
    int& seen = source >= 0 ? state_seen[source] : user_seen[-1 - source];
    if (seen++ != 0) return malformed("source");
    self->sources->push_back(source);
  }
  for (int seen : state_seen) {
    if (seen != 1) return malformed("source");
  }
  self->in_order = true;
  for (Py_ssize_t i = 0; i < argument_count; ++i) {
    Py_ssize_t source = (*self->sources)[i];
    self->in_order = self->in_order && (i < state_count ? source == i : source == state_count - 1 - i);
  }
  for (int seen : user_seen) {
    if (seen != 1) return malformed("source");
  }
  for (const UserInput& input : *self->users) {
    if (input.argument >= argument_count || (*self->sources)[input.argument] >= 0) return malformed("input");
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pairs); ++i) {
    Py_ssize_t first, second;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pairs, i), "nn", &first, &second)) return -1;
    if (first < 0 || second < 0 || first >= user_count || second >= user_count ||
        (*self->users)[static_cast<size_t>(first)].source == KEY || (*self->users)[static_cast<size_t>(second)].source == KEY) {
      return malformed("pair");
    }
    self->pairs->emplace_back(first, second);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(checks); ++i) {
    int step;
    Py_ssize_t argument, result, user;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(checks, i), "innn", &step, &argument, &result, &user)) return -1;
    if ((step != WROTE_IN_PLACE && step != TAKEN) || argument < 0 || argument >= argument_count ||
        (step == WROTE_IN_PLACE && (result < 0 || user < 0 || user >= user_count))) {
      return malformed("check");
    }
    self->checks->push_back({step, argument, result, user});
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(commits); ++i) {
    int step;
    Py_ssize_t argument, result, state;
    PyObject* target;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(commits, i), "innOn", &step, &argument, &result, &target, &state)) {
      return -1;
    }
    Commit commit{step, argument, result, -1, nullptr, state};
    if (argument < 0 || argument >= argument_count || result < 0) return malformed("commit");
    if (step == SET_BACKING) {
      commit.user = PyLong_Check(target) ? PyLong_AsSsize_t(target) : -1;
      if (commit.user < 0 || commit.user >= user_count) {
        PyErr_Clear();
        return malformed("commit");
      }
    } else if (step == SET_SLOT) {
      if (state < 0 || state >= state_count || (*self->sources)[argument] != state) return malformed("commit");
      commit.slot = hold(target);
    } else {
      return malformed("commit");
    }
    self->commits->push_back(commit);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(donated); ++i) {
    Py_ssize_t argument = PyLong_AsSsize_t(PyTuple_GET_ITEM(donated, i));
    if (argument == -1 && PyErr_Occurred()) return -1;
    if (argument < 0 || argument >= argument_count) return malformed("donated state");
    self->donated_state->push_back(argument);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outputs); ++i) {
    Py_ssize_t result;
    PyObject *dtype, *shape, *strides, *nbytes;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outputs, i), "nOOOO!", &result, &dtype, &shape, &strides, &PyLong_Type,
                          &nbytes)) {
      return -1;
    }
    if (result < 0) return malformed("output");
    Output output{result, at::ScalarType::Undefined, {}, {}, hold(nbytes)};
    if (!dtype_of(dtype, output.dtype) || !shape_of(shape, output.shape) || !shape_of(strides, output.strides)) {
      return -1;
    }
    if (output.strides.size() != output.shape.size()) return malformed("output");
    self->outputs->push_back(std::move(output));
  }
  if (mode == SINGLE && self->outputs->size() != 1) {
    PyErr_SetString(PyExc_ValueError, "Lane: a single output needs one result");
    return -1;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kept); ++i) {
    PyObject* index = PyTuple_GET_ITEM(kept, i);
    Py_ssize_t argument = PyLong_Check(index) ? PyLong_AsSsize_t(index) : -1;
    if (argument < 0 || argument >= argument_count) {
      PyErr_Clear();
      return malformed("kept");
    }
    self->kept->push_back(hold(index));
  }
  return 0;
}

PyObject* lane_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Lane*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  for (auto& ref : self->refs) ref = nullptr;
  self->users = new std::vector<UserInput>();
  self->sources = new std::vector<Py_ssize_t>();
  self->in_order = false;
  self->pairs = new std::vector<std::pair<Py_ssize_t, Py_ssize_t>>();
  self->checks = new std::vector<Check>();
  self->commits = new std::vector<Commit>();
  self->outputs = new std::vector<Output>();
  self->kept = new std::vector<PyObject*>();
  self->donated_state = new std::vector<Py_ssize_t>();
  self->held = new std::vector<PyObject*>();
  self->mode = SINGLE;
  self->refill = false;
  self->state_count = 0;
  self->calls = self->fallbacks = self->finished_in_python = 0;
  return reinterpret_cast<PyObject*>(self);
}

int lane_traverse(Lane* self, visitproc visit, void* arg) {
  for (PyObject* ref : self->refs) Py_VISIT(ref);
  for (PyObject* object : *self->held) Py_VISIT(object);
  return 0;
}

int lane_clear(Lane* self) {
  for (auto& ref : self->refs) Py_CLEAR(ref);
  std::vector<PyObject*> held;
  held.swap(*self->held);
  self->users->clear();
  self->sources->clear();
  self->pairs->clear();
  self->checks->clear();
  self->commits->clear();
  self->outputs->clear();
  self->kept->clear();
  self->donated_state->clear();
  for (PyObject* object : held) Py_DECREF(object);
  return 0;
}

void lane_dealloc(Lane* self) {
  PyObject_GC_UnTrack(self);
  lane_clear(self);
  delete self->users;
  delete self->sources;
  delete self->pairs;
  delete self->checks;
  delete self->commits;
  delete self->outputs;
  delete self->kept;
  delete self->donated_state;
  delete self->held;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* lane_counts(Lane* self, void*) {
  return Py_BuildValue("{s:n,s:n,s:n}", "calls", self->calls, "fallbacks", self->fallbacks, "finished_in_python",
                       self->finished_in_python);
}

PyGetSetDef lane_getset[] = {
    {"counts", reinterpret_cast<getter>(lane_counts), nullptr,
     "{'calls': calls the lane ran and committed, 'fallbacks': calls it left to the Python path before running, "
     "'finished_in_python': calls it ran whose commit was Python's}",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject LaneType = {PyVarObject_HEAD_INIT(nullptr, 0)};

int64_t monotonic_ns() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);  // time.perf_counter_ns's clock
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// hloalias.runtime.pjrt.wait_ready (whose docstring is the contract),
// without an interpreter loop: 1 in time, 0 not, -1 an error.
int wait_ready_in(PyObject* sequence, int64_t spin) {
  PyObject* arrays = PySequence_Fast(sequence, "wait_ready: arrays");
  if (arrays == nullptr) return -1;
  Refs refs;
  refs.keep(arrays);
  int64_t deadline = 0;
  bool in_time = true;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(arrays); ++i) {
    PyObject* array = PySequence_Fast_GET_ITEM(arrays, i);
    if (in_time) {
      for (;;) {
        PyObject* ready = call_method0(array, s_is_ready);
        if (ready == nullptr) return -1;
        int truth = PyObject_IsTrue(ready);
        Py_DECREF(ready);
        if (truth < 0) return -1;
        if (truth) break;
        int64_t now = monotonic_ns();
        if (deadline == 0) {
          deadline = now + spin;
        } else if (now >= deadline) {
          in_time = false;
          break;
        }
      }
    }
    PyObject* done = call_method0(array, s_block_until_ready);
    if (done == nullptr) return -1;
    Py_DECREF(done);
  }
  return in_time && (deadline == 0 || monotonic_ns() < deadline) ? 1 : 0;
}

// wait_ready(arrays, spin_ns) -> bool
PyObject* wait_ready(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "wait_ready(arrays, spin_ns)");
    return nullptr;
  }
  long long spin = PyLong_AsLongLong(args[1]);
  if (spin == -1 && PyErr_Occurred()) return nullptr;
  int in_time = wait_ready_in(args[0], spin);
  return in_time < 0 ? nullptr : PyBool_FromLong(in_time);
}

// Waiter(spin_ns): SingleDeviceDispatch's wait policy (runtime/pjrt.py,
// SingleDeviceDispatch._wait, whose docstring is the contract) as a native
// callable: waiter(results) returns once every result is ready.
struct Waiter {
  PyObject_HEAD
  int64_t spin;
  bool poll;
};

int waiter_init(Waiter* self, PyObject* args, PyObject* kwargs) {
  long long spin;
  if (!PyArg_ParseTuple(args, "L", &spin)) return -1;
  self->spin = spin;
  self->poll = true;
  return 0;
}

PyObject* waiter_call(Waiter* self, PyObject* args, PyObject* kwargs) {
  PyObject* results;
  if ((kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || !PyArg_ParseTuple(args, "O", &results)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Waiter(results)");
    return nullptr;
  }
  if (self->poll) {
    int in_time = wait_ready_in(results, self->spin);
    if (in_time < 0) return nullptr;
    self->poll = in_time == 1;
    Py_RETURN_NONE;
  }
  PyObject* arrays = PySequence_Fast(results, "Waiter: results");
  if (arrays == nullptr) return nullptr;
  Refs refs;
  refs.keep(arrays);
  int64_t start = monotonic_ns();
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(arrays); ++i) {
    PyObject* done = call_method0(PySequence_Fast_GET_ITEM(arrays, i), s_block_until_ready);
    if (done == nullptr) return nullptr;
    Py_DECREF(done);
  }
  self->poll = monotonic_ns() - start < self->spin;
  Py_RETURN_NONE;
}

PyObject* waiter_polling(Waiter* self, void*) { return PyBool_FromLong(self->poll); }

PyGetSetDef waiter_getset[] = {
    {"polling", reinterpret_cast<getter>(waiter_polling), nullptr, "whether the next wait polls first", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject WaiterType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// first_changed(refs, versions, pointers) -> int: the index of the first
// tensor (weakrefs; a dead one is skipped) whose version counter or data
// pointer differs from the ones given, or -1.  runtime/state.py's check of
// the module's tensors before every call (StateWatch), in native code: it
// runs once per state tensor per call.
PyObject* first_changed(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[0]) || PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[0])) {
    PyErr_SetString(PyExc_TypeError, "first_changed(refs, versions, pointers): three tuples of one length");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* tensor = PyWeakref_GetObject(PyTuple_GET_ITEM(args[0], i));  // borrowed
    if (tensor == nullptr) return nullptr;
    if (tensor == Py_None) continue;
    if (!THPVariable_Check(tensor)) {
      PyErr_SetString(PyExc_TypeError, "first_changed: a reference to something other than a tensor");
      return nullptr;
    }
    const long long version = PyLong_AsLongLong(PyTuple_GET_ITEM(args[1], i));
    const long long pointer = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], i));
    if ((version == -1 || pointer == -1) && PyErr_Occurred()) return nullptr;
    const at::Tensor& value = THPVariable_Unpack(tensor);
    if (static_cast<long long>(value._version()) != version ||
        reinterpret_cast<intptr_t>(value.data_ptr()) != static_cast<intptr_t>(pointer)) {
      return PyLong_FromSsize_t(i);
    }
  }
  return PyLong_FromLong(-1);
}

// first_differing(refs, snapshots) -> int: the index of the first tensor
// (weakrefs; a dead one is skipped) whose bytes differ from its snapshot's
// (another dtype or shape differs), or -1.  runtime/state.py's check, at
// every call (StateWatch), of the state torch may change in place without
// counting a version (a batch norm's running statistics: small vectors, so
// a memcmp each).  A tensor that is not a plain dense CPU one counts as
// differing: the Python check (_StateSlot.torch_changed) then decides.
PyObject* first_differing(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[0])) {
    PyErr_SetString(PyExc_TypeError, "first_differing(refs, snapshots): two tuples of one length");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* tensor = PyWeakref_GetObject(PyTuple_GET_ITEM(args[0], i));  // borrowed
    if (tensor == nullptr) return nullptr;
    if (tensor == Py_None) continue;
    PyObject* snapshot = PyTuple_GET_ITEM(args[1], i);
    if (!THPVariable_Check(tensor) || !THPVariable_Check(snapshot)) {
      PyErr_SetString(PyExc_TypeError, "first_differing: something other than a tensor");
      return nullptr;
    }
    const at::Tensor& value = THPVariable_Unpack(tensor);
    const at::Tensor& copy = THPVariable_Unpack(snapshot);
    const bool plain = value.is_cpu() && copy.is_cpu() && value.layout() == at::kStrided &&
                       value.is_contiguous() && copy.is_contiguous() && !value.is_conj() && !value.is_neg() &&
                       !value.unsafeGetTensorImpl()->is_python_dispatch();
    if (!plain || value.scalar_type() != copy.scalar_type() || !value.sizes().equals(copy.sizes())) {
      return PyLong_FromSsize_t(i);
    }
    const size_t bytes = value.nbytes();
    if (bytes != 0 && std::memcmp(value.const_data_ptr(), copy.const_data_ptr(), bytes) != 0) {
      return PyLong_FromSsize_t(i);
    }
  }
  return PyLong_FromLong(-1);
}

// values_in_range(tensor, low, high) -> bool | None: whether every element
// of a dense CPU tensor of a signed integer dtype lies in [low, high) (the
// lane's own check of an index input's row), None for any other tensor.
// runtime/plan.py's _IndexCheck on the Python path, once per index input per call.
PyObject* values_in_range(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "values_in_range(tensor, low, high)");
    return nullptr;
  }
  const long long low = PyLong_AsLongLong(args[1]);
  const long long high = PyLong_AsLongLong(args[2]);
  if ((low == -1 || high == -1) && PyErr_Occurred()) return nullptr;
  const at::Tensor& tensor = THPVariable_Unpack(args[0]);
  UserInput row{};
  row.dtype = tensor.scalar_type();
  row.low = low;
  row.high = high;
  if (!tensor.is_cpu() || tensor.layout() != at::kStrided || !tensor.is_contiguous() ||
      (row.dtype != at::ScalarType::Long && row.dtype != at::ScalarType::Int && row.dtype != at::ScalarType::Short &&
       row.dtype != at::ScalarType::Char)) {
    Py_RETURN_NONE;
  }
  return PyBool_FromLong(within_range(row, tensor));
}

// --- Releases of DLPack imports (guard_dlpack, drain_releases, release_stats)
//
// PJRT releases a DLPack import (calls the DLManagedTensor's deleter) on
// whichever thread drops its last hold, and after a call that can be its
// worker thread, a moment after the results were ready.  torch's deleter
// takes the GIL there, which aborts a process already finalizing.
// guard_dlpack swaps the capsule's deleter for guarded_release: run at once
// on a Python thread (may_take_gil), else queued (no Python, no GIL: a mutex
// and a vector, both never destroyed, so a worker outliving the
// interpreter and C++'s static destructors still finds them) and run by
// drain_releases, which a thread holding the GIL calls (at every new
// import and at exit, runtime/ownership.py).  A release queued after the
// last drain is never run: the process is exiting, its memory goes with it.

struct GuardedDeleter {
  void (*deleter)(DLManagedTensor*);
  void* context;
};

struct ReleaseQueue {
  std::mutex mutex;
  std::vector<DLManagedTensor*> pending;
  std::atomic<unsigned long long> direct{0};  // run at once, on a Python thread (may_take_gil)
  std::atomic<unsigned long long> queued{0};  // left by a thread without it
  std::atomic<unsigned long long> drained{0};  // run later by drain_releases
};

ReleaseQueue* release_queue = nullptr;  // made at import, never freed (see above)

// Whether this thread holds the GIL: the interpreter's running thread
// state is this thread's own.  Not PyGILState_Check, which answers yes on
// every thread once finalization has deleted its thread-local key; this
// answers no there (PyGILState_GetThisThreadState is null then), and on
// any thread Python never ran on (PJRT's workers).
bool holds_gil() {
  PyThreadState* running = _PyThreadState_UncheckedGet();
  return running != nullptr && running == PyGILState_GetThisThreadState();
}

// Whether a release here may run torch's deleter, which takes the GIL:
// this thread holds it, or it is a Python thread that let it go for a
// moment (jaxlib deletes an array with the GIL released) while the
// interpreter is not finalizing, as torch's own deleter assumes.  Never on
// a thread Python has no state for (PJRT's workers): those queue.
bool may_take_gil() {
  if (holds_gil()) return true;
  return PyGILState_GetThisThreadState() != nullptr && !_Py_IsFinalizing();
}

void guarded_release(DLManagedTensor* managed) {
  auto* guard = static_cast<GuardedDeleter*>(managed->manager_ctx);
  managed->manager_ctx = guard->context;
  managed->deleter = guard->deleter;
  delete guard;
  if (managed->deleter == nullptr) return;
  if (may_take_gil()) {
    release_queue->direct.fetch_add(1, std::memory_order_relaxed);
    managed->deleter(managed);
    return;
  }
  std::lock_guard<std::mutex> lock(release_queue->mutex);
  release_queue->pending.push_back(managed);
  release_queue->queued.fetch_add(1, std::memory_order_relaxed);
}

// Runs the queued releases (the caller holds the GIL); returns how many.
size_t drain() {
  std::vector<DLManagedTensor*> pending;
  {
    std::lock_guard<std::mutex> lock(release_queue->mutex);
    pending.swap(release_queue->pending);
  }
  for (DLManagedTensor* managed : pending) managed->deleter(managed);
  release_queue->drained.fetch_add(pending.size(), std::memory_order_relaxed);
  return pending.size();
}

// guard_dlpack(capsule) -> capsule: the same unused "dltensor" capsule, its
// deleter guarded (above); the releases queued so far are run first.
PyObject* guard_dlpack(PyObject*, PyObject* capsule) {
  drain();
  if (!PyCapsule_IsValid(capsule, "dltensor")) {
    PyErr_SetString(PyExc_TypeError, "guard_dlpack: not an unused DLPack capsule ('dltensor')");
    return nullptr;
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) return nullptr;
  if (managed->deleter != nullptr && managed->deleter != guarded_release) {
    managed->manager_ctx = new GuardedDeleter{managed->deleter, managed->manager_ctx};
    managed->deleter = guarded_release;
  }
  return Py_NewRef(capsule);
}

// drain_releases() -> int: run the queued releases now; how many ran.
PyObject* drain_releases(PyObject*, PyObject*) { return PyLong_FromSize_t(drain()); }

// release_stats() -> (direct, queued, drained, pending): counts since import.
PyObject* release_stats(PyObject*, PyObject*) {
  size_t pending;
  {
    std::lock_guard<std::mutex> lock(release_queue->mutex);
    pending = release_queue->pending.size();
  }
  return Py_BuildValue("(KKKn)", release_queue->direct.load(), release_queue->queued.load(),
                       release_queue->drained.load(), static_cast<Py_ssize_t>(pending));
}

PyMethodDef module_methods[] = {
    {"guard_dlpack", guard_dlpack, METH_O, "guard_dlpack(capsule) -> capsule: see runtime/ownership.py's torch_to_device."},
    {"drain_releases", drain_releases, METH_NOARGS, "drain_releases() -> int: run the DLPack releases queued by PJRT's threads."},
    {"release_stats", release_stats, METH_NOARGS, "release_stats() -> (direct, queued, drained, pending) DLPack releases."},
    {"values_in_range", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(values_in_range)),
     METH_FASTCALL, "values_in_range(tensor, low, high) -> bool | None: see runtime/plan.py's _IndexCheck."},
    {"first_changed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(first_changed)), METH_FASTCALL,
     "first_changed(refs, versions, pointers) -> int: see runtime/state.py's StateWatch."},
    {"first_differing", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(first_differing)),
     METH_FASTCALL, "first_differing(refs, snapshots) -> int: see runtime/state.py's StateWatch."},
    {"wait_ready", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(wait_ready)), METH_FASTCALL,
     "wait_ready(arrays, spin_ns) -> bool: see hloalias.runtime.pjrt.wait_ready."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_lane",
                          "The native call path of single-device CPU executables (see Lane).", -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit__lane() {
  if (!intern(&s_array, "array") || !intern(&s_address, "address") || !intern(&s_nbytes, "nbytes") ||
      !intern(&s_interface, "__array_interface__") || !intern(&s_consumed_by, "consumed_by") ||
      !intern(&s_is_deleted, "is_deleted") || !intern(&s_unsafe_buffer_pointer, "unsafe_buffer_pointer") ||
      !intern(&s_run, "run") || !intern(&s_dispatch, "dispatch") || !intern(&s_entry, "entry") || !intern(&s_state_arrays, "state_arrays") ||
      !intern(&s_stored_array, "_array") || !intern(&s_is_ready, "is_ready") ||
      !intern(&s_block_until_ready, "block_until_ready") || !intern(&s_wait, "wait") || !intern(&s_arguments, "arguments") ||
      !intern(&s_acquire, "acquire") || !intern(&s_release, "release") || !intern(&s_calls, "_calls") ||
      !intern(&s_unreturned, "unreturned") || !intern(&s_ran_results, "ran_results")) {
    return nullptr;
  }
  if (release_queue == nullptr) release_queue = new ReleaseQueue();
  LaneType.tp_name = "hloalias.runtime._lane.Lane";
  LaneType.tp_basicsize = sizeof(Lane);
  LaneType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  LaneType.tp_doc = "One executable's native call path: lane(user_inputs) -> outputs, or the fallback object.";
  LaneType.tp_new = lane_new;
  LaneType.tp_init = reinterpret_cast<initproc>(lane_init);
  LaneType.tp_call = reinterpret_cast<ternaryfunc>(lane_call);
  LaneType.tp_traverse = reinterpret_cast<traverseproc>(lane_traverse);
  LaneType.tp_clear = reinterpret_cast<inquiry>(lane_clear);
  LaneType.tp_dealloc = reinterpret_cast<destructor>(lane_dealloc);
  LaneType.tp_getset = lane_getset;
  if (PyType_Ready(&LaneType) < 0) return nullptr;
  WaiterType.tp_name = "hloalias.runtime._lane.Waiter";
  WaiterType.tp_basicsize = sizeof(Waiter);
  WaiterType.tp_flags = Py_TPFLAGS_DEFAULT;
  WaiterType.tp_doc = "Waiter(spin_ns): waiter(results) returns once every result is ready (SingleDeviceDispatch's policy).";
  WaiterType.tp_new = PyType_GenericNew;
  WaiterType.tp_init = reinterpret_cast<initproc>(waiter_init);
  WaiterType.tp_call = reinterpret_cast<ternaryfunc>(waiter_call);
  WaiterType.tp_getset = waiter_getset;
  if (PyType_Ready(&WaiterType) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (PyModule_AddObjectRef(module, "Lane", reinterpret_cast<PyObject*>(&LaneType)) < 0 ||
      PyModule_AddObjectRef(module, "Waiter", reinterpret_cast<PyObject*>(&WaiterType)) < 0 ||
      PyModule_AddIntConstant(module, "ABI_VERSION", kAbiVersion) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
