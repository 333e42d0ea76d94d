"""Same process, branch bnstats: StateWatch.changed() with the value compare of the batch-norm statistics and without it (its tuples emptied), interleaved 7 rounds (each the min of 3 x 20000), and `_lane.first_differing` alone.  `python bench/bn_value_watch_interleaved.py cnn|deep`; prints one JSON line."""
import json, sys, timeit, torch, hloalias
torch.manual_seed(0)
case = sys.argv[1]
if case == "cnn":
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 2)); x = torch.randn(2, 3, 8, 8)
else:
    layers = []
    for _ in range(16): layers += [torch.nn.Conv2d(32, 32, 1), torch.nn.BatchNorm2d(32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers); x = torch.randn(1, 32, 4, 4)
model.eval(); exe = hloalias.compile(model, (x,))
with torch.no_grad():
    for _ in range(20): exe(x)
w = exe._state_watch
refs, snaps = w._value_refs, w._snapshots
on, off = [], []
for _ in range(7):
    w._value_refs, w._snapshots = refs, snaps
    on.append(min(timeit.repeat(w.changed, number=20000, repeat=3)) / 20000 * 1e9)
    w._value_refs, w._snapshots = (), ()
    off.append(min(timeit.repeat(w.changed, number=20000, repeat=3)) / 20000 * 1e9)
w._value_refs, w._snapshots = refs, snaps
fd = w._first_differing
direct = min(timeit.repeat(lambda: fd(refs, snaps), number=20000, repeat=5)) / 20000 * 1e9
print(json.dumps({"case": case, "slots": len(w.slots), "compared": len(refs), "with_ns": [round(v) for v in on], "without_ns": [round(v) for v in off], "first_differing_alone_ns": round(direct)}))
