"""Several processes: 2 processes x 2 CPU devices run data-parallel and
tensor-parallel training steps and a tensor-parallel decode step on one
mesh over the 4 devices (``hloalias.runtime.distributed``, started by
``python -m hloalias.tools.launch``); their results, state and per-device
bytes equal a single-process run; a sharded checkpoint saved by 2
processes loads in 2 and in 1.  And the launcher's contract: prefixed
output, the first failure's status, no process left behind.

Every subprocess runs under a timeout: a hang fails the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import pytest
import torch

import hloalias
from distributed import worker
from hloalias.tools.launch import child_environment, free_port

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(worker.__file__)
RUN_TIMEOUT_S = 240


def _launch(*arguments: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m hloalias.tools.launch ARGUMENTS``, output captured."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the launcher's --devices decides
    return subprocess.run(
        [sys.executable, "-m", "hloalias.tools.launch", *arguments],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )


def _reports(out: Path, mode: str, run: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return [torch.load(out / f"{mode}-rank-{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("distributed")
    run = _launch("-n", "2", "--devices", "2", "--timeout", str(RUN_TIMEOUT_S - 20), str(WORKER), "train", str(out))
    return out, _reports(out, "train", run)


def _eager_training(steps: int, seed: int = 0) -> tuple[list[float], worker.MLP, torch.optim.Optimizer]:
    model, optimizer, step = worker.trainer(seed)
    losses = [float(step(x, y).detach()) for x, y in worker.batches()[:steps]]
    return losses, model, optimizer


def _assert_state_equals_eager(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for name, value in model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value)
    expected = optimizer.state_dict()["state"]
    assert set(state["optimizer"]["state"]) == set(expected)
    for index, entries in expected.items():
        for key, value in entries.items():
            torch.testing.assert_close(state["optimizer"]["state"][index][key], value)


@pytest.mark.parametrize("kind", ["dp", "tp"])
def test_training_steps_across_processes_equal_a_single_process(
    trained: tuple[Path, list[dict[str, Any]]], kind: str
) -> None:
    _, reports = trained
    losses, model, optimizer = _eager_training(worker.STEPS)
    for report in reports:
        assert report["process_count"] == 2
        torch.testing.assert_close(torch.tensor(report[f"{kind}_losses"]), torch.tensor(losses))
        _assert_state_equals_eager(report[f"{kind}_state"], model, optimizer)


def test_state_is_sharded_across_processes_and_updated_in_place(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = trained
    # The same steps on one process's 4 devices: the same bytes per device.
    data = worker.batches()
    single: dict[str, dict[str, int]] = {}
    for kind, mesh, shardings in (
        ("dp", hloalias.Mesh((4,), ("dp",)), worker.DATA_PARALLEL),
        ("tp", hloalias.Mesh((2, 2), ("dp", "tp")), worker.TENSOR_PARALLEL),
    ):
        model, optimizer, step = worker.trainer()
        train = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=mesh, shardings=shardings)
        figures = list(train.executable.memory_stats_per_device.values())
        assert len(figures) == 4 and all(f == figures[0] for f in figures)
        single[kind] = figures[0]
    for report in reports:
        # fc1.weight (32 x 16) over tp=2: each of this process's 2 devices holds 16 rows.
        assert report["tp_local_shard_shapes"] == [(16, 16), (16, 16)]
        # Every state tensor (4 parameters, 3 Adam tensors each) is aliased in place.
        assert report["dp_aliases"] == 16
        for kind in ("dp", "tp"):
            for stats in report[f"{kind}_bytes"].values():
                assert stats == single[kind]
                assert stats["alias_bytes"] > 0


def test_bytes_are_reported_per_process_for_its_own_devices(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = trained
    devices = [sorted(report["forward_bytes"]) for report in reports]
    assert devices[0] != devices[1] and all(len(d) == 2 for d in devices)
    assert not set(devices[0]) & set(devices[1])
    for report in reports:
        for stats in report["forward_bytes"].values():
            # fc1/fc2 weights and fc1's bias over tp=2, fc2's bias whole, x (8 x 16) over dp=2.
            assert stats["argument_bytes"] == (32 * 16 + 32 + 16 * 32) * 4 // 2 + 16 * 4 + 8 * 16 * 4 // 2
        for stats in report["decode_bytes"].values():
            # The two caches (4 heads x 8 x 8) over 4 devices, aliased in place.
            assert stats["alias_bytes"] == 2 * 4 * 8 * 8 * 4 // 4


def test_forward_and_decode_across_processes_equal_eager(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = trained
    x = worker.batches()[0][0]
    expected_forward = worker.MLP()(x).detach()
    decode = worker.Decode()
    expected = [decode(token, torch.tensor([i])).detach() for i, token in enumerate(worker.tokens())]
    for report in reports:
        torch.testing.assert_close(report["forward"], expected_forward)
        for got, want in zip(report["decode"], expected):
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(report["decode_state"]["k_cache"], decode.k_cache)
        torch.testing.assert_close(report["decode_state"]["v_cache"], decode.v_cache)


def test_reads_of_a_mesh_programs_module_state_across_processes_are_refused_until_written_back(
    trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    """After calls of a program on a mesh across processes, a bare read of
    the module's buffer, its ``state_dict()`` and an eager forward would
    see the state from before them (the copy in is a collective): each is
    an ExecutionError naming ``write_back()``, and the tensors stay marked;
    after ``write_back()`` in every process they hold the calls' values."""
    _, reports = trained
    decode = worker.Decode()
    for i, token in enumerate(worker.tokens()):
        decode(token, torch.tensor([i]))
    for report in reports:
        for key in ("decode_bare_read", "decode_module_state_dict", "decode_eager_forward"):
            assert report[key].startswith("ExecutionError: "), (key, report[key])
            assert "write_back() of the compiled program in every process" in report[key]
            assert "across processes" in report[key] and "Decode" in report[key]
        assert report["decode_stale_after_refusals"]
        for name in ("k_cache", "v_cache"):
            torch.testing.assert_close(report["decode_written_back"][name], getattr(decode, name).detach())


def test_bf16_state_across_processes_equals_eager(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = trained
    eager = worker.Accumulator()
    expected = [eager(x) for x in worker.bf16_inputs()]
    for report in reports:
        for got, want in zip(report["bf16"], expected):
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(report["bf16_state"]["total"], eager.total, rtol=0, atol=0)


def test_64bit_results_and_state_across_processes_equal_eager(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    """int64/float64 results and state sharded over both processes keep
    their dtype and values 32 bits cannot hold (gathered from both)."""
    _, reports = trained
    eager = worker.Wide()
    expected = [eager(x, y) for x, y in worker.wide_inputs()]
    for report in reports:
        for got_call, want_call in zip(report["wide"], expected):
            for got, want in zip(got_call, want_call):
                assert got.dtype == want.dtype
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        for state in (report["wide_state"], report["wide_written_back"]):
            for name in ("count", "total"):
                assert state[name].dtype == getattr(eager, name).dtype
                torch.testing.assert_close(state[name], getattr(eager, name), rtol=0, atol=0)


def test_misuse_is_named(trained: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = trained
    for rank, report in enumerate(reports):
        assert report["initialize_twice"].startswith("DistributedError: ") and "already called" in report[
            "initialize_twice"
        ]
        assert report["mesh_too_large"].startswith("ShardingError: ")
        assert "needs 8 devices" in report["mesh_too_large"] and "4 across 2 processes" in report["mesh_too_large"]
        message = report["different_program"]
        assert message.startswith("DistributedError: ") and f"process {rank} compiled module" in message
        assert f"process {1 - rank} compiled" in message


def test_a_save_one_process_cannot_write_keeps_the_earlier_checkpoint(
    trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    """Process 1's disk is full as it writes its shard file over an
    existing checkpoint (of the step before): both processes raise, naming
    it, and the checkpoint stays the earlier one, whole (the load tests
    below read it), with nothing staged left beside it.  Before, process
    0's new shard file replaced its old one beside process 1's old file,
    and process 0 waited at the final barrier until its timeout."""
    _, reports = trained
    assert reports[0]["failed_save"].startswith("ExecutionError: ")
    assert "process 1 could not write its shard file: OSError" in reports[0]["failed_save"]
    assert "No space left" in reports[1]["failed_save"]
    for report in reports:
        assert report["beside_ckpt"] == [], report["beside_ckpt"]


def test_checkpoint_saved_by_two_processes_loads_in_two(
    trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, saved = trained
    run = _launch("-n", "2", "--devices", "2", "--timeout", str(RUN_TIMEOUT_S - 20), str(WORKER), "load", str(out))
    losses, model, optimizer = _eager_training(worker.STEPS + 1)
    for report, before in zip(_reports(out, "load", run), saved):
        for name, value in before["tp_state"]["model"].items():
            torch.testing.assert_close(report["loaded_state"]["model"][name], value, rtol=0, atol=0)
        for index, entries in before["tp_state"]["optimizer"]["state"].items():
            for key, value in entries.items():
                torch.testing.assert_close(report["loaded_state"]["optimizer"]["state"][index][key], value, rtol=0, atol=0)
        # The step continues from the checkpoint as eager continues.
        torch.testing.assert_close(torch.tensor(report["next_loss"]), torch.tensor(losses[-1]))


@pytest.mark.parametrize("mesh", [None, (2, 2)])
def test_checkpoint_saved_by_two_processes_loads_in_one(
    trained: tuple[Path, list[dict[str, Any]]], mesh: tuple[int, int] | None
) -> None:
    out, saved = trained
    model, optimizer, step = worker.trainer(seed=5)
    data = worker.batches()
    if mesh is None:
        train = hloalias.compile_training_step(step, model, optimizer, data[0])
    else:
        train = hloalias.compile_training_step(
            step, model, optimizer, data[0], mesh=hloalias.Mesh(mesh, ("dp", "tp")), shardings=worker.TENSOR_PARALLEL
        )
    hloalias.checkpoint.load(train, out / "ckpt")
    state = train.state_dict()
    expected = saved[0]["tp_state"]
    for name, value in expected["model"].items():
        torch.testing.assert_close(state["model"][name], value, rtol=0, atol=0)
    for index, entries in expected["optimizer"]["state"].items():
        for key, value in entries.items():
            torch.testing.assert_close(state["optimizer"]["state"][index][key], value, rtol=0, atol=0)
    losses, _, _ = _eager_training(worker.STEPS + 1)
    torch.testing.assert_close(torch.tensor(float(train(*data[worker.STEPS]))), torch.tensor(losses[-1]))


def test_checkpoint_with_a_missing_shard_file_is_refused(
    trained: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = trained
    for name in ("metadata.json", "shards-0.pt"):
        (tmp_path / name).write_bytes((out / "ckpt" / name).read_bytes())
    model, optimizer, step = worker.trainer(seed=5)
    train = hloalias.compile_training_step(step, model, optimizer, worker.batches()[0])
    before = train.state_dict()
    with pytest.raises(hloalias.ExecutionError, match="shard file of process 1"):
        hloalias.checkpoint.load(train, tmp_path)
    torch.testing.assert_close(train.state_dict()["model"], before["model"], rtol=0, atol=0)


# -- random ops, each process seeded differently ---------------------------------


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("random")
    run = _launch("-n", "2", "--devices", "2", "--timeout", str(RUN_TIMEOUT_S - 20), str(WORKER), "random", str(out))
    return _reports(out, "random", run)


def _mesh_draws(seed: int) -> tuple[list[torch.Tensor], list[float], dict[str, Any]]:
    """The random mode's programs on this process's 4 devices, torch seeded with ``seed``."""
    mesh = hloalias.Mesh((4,), ("dp",))
    x = torch.ones(8, 64)
    dropped = hloalias.compile(worker.dropout, (x,), mesh=mesh)
    torch.manual_seed(seed)
    masks = [dropped(x), dropped(x)]
    data = worker.batches()
    model, optimizer, step = worker.dropped_trainer()
    train = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=mesh, shardings=worker.DATA_PARALLEL)
    torch.manual_seed(seed)
    losses = [float(train(x, y)) for x, y in data[: worker.STEPS]]
    return masks, losses, train.state_dict()


def test_processes_seeded_differently_draw_the_key_of_process_0(drawn: list[dict[str, Any]]) -> None:
    # Replicated values (dropout of replicated data, replicated parameters
    # after steps with dropout) are the same in every process: the draws
    # of one process on the mesh seeded as process 0.
    masks, losses, state = _mesh_draws(worker.random_seed(0))
    assert not torch.equal(masks[0], masks[1])
    for report in drawn:
        for run in range(2):  # seeded again: drawn again
            for got, want in zip(report[f"dropout_{run}"], masks):
                assert torch.equal(got, want)
        torch.testing.assert_close(torch.tensor(report["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)
        for name, value in state["model"].items():
            torch.testing.assert_close(report["state"]["model"][name], value, rtol=1e-5, atol=1e-6)
    for name, value in drawn[0]["state"]["model"].items():
        assert torch.equal(drawn[1]["state"]["model"][name], value), name


def test_each_process_advances_its_own_generator_once_per_call(drawn: list[dict[str, Any]]) -> None:
    from hloalias.runtime.executable import draw_rng_bits

    for rank, report in enumerate(drawn):
        torch.manual_seed(worker.random_seed(rank))
        for _ in range(2):
            draw_rng_bits()
        assert torch.equal(report["rng_state_after_dropout"], torch.get_rng_state())
        torch.manual_seed(worker.random_seed(rank))
        for _ in range(worker.STEPS):
            draw_rng_bits()
        assert torch.equal(report["rng_state_after_training"], torch.get_rng_state())
        assert "the program reads row 0, the key of process 0 (it drives cpu:0)" in report["explain"]


# -- initialize ----------------------------------------------------------------


def test_initialize_without_settings_or_after_jax_started_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(hloalias.DistributedError, match="missing coordinator_address .* WORLD_SIZE"):
        hloalias.distributed.initialize()
    jax.devices()  # this process's jax has started
    with pytest.raises(hloalias.DistributedError, match="before anything uses a jax device"):
        hloalias.distributed.initialize("127.0.0.1:1", 2, 0)
    with pytest.raises(hloalias.DistributedError, match="process_id 2 is not in 0..1"):
        hloalias.distributed.initialize("127.0.0.1:1", 2, 2)
    assert not hloalias.distributed.is_initialized()


# -- the launcher ----------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text("import os, sys, time\nrank = int(os.environ['RANK'])\n" + body)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_sets_torchrun_variables_and_prefixes_output(tmp_path: Path) -> None:
    script = _script(tmp_path, (
        "print(rank, os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'], "
        "os.environ['MASTER_PORT'], os.environ['XLA_FLAGS'], sys.argv[1:])\n"
    ))
    run = _launch("-n", "3", "--devices", "2", str(script), "a", "--b", timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = sorted(line for line in run.stdout.splitlines() if line.startswith("[rank"))
    assert len(lines) == 3
    ports = set()
    for rank, line in enumerate(lines):
        assert line.startswith(f"[rank {rank}] {rank} 3 {rank} 127.0.0.1 ")
        assert "--xla_force_host_platform_device_count=2" in line and line.endswith("['a', '--b']")
        ports.add(line.split(" ")[6])
    assert len(ports) == 1


def test_launcher_stops_every_rank_when_one_fails(tmp_path: Path) -> None:
    script = _script(tmp_path, (
        f"open(os.path.join({str(tmp_path)!r}, f'pid-{{rank}}'), 'w').write(str(os.getpid()))\n"
        "if rank == 1:\n    time.sleep(1)\n    sys.exit(3)\n"
        "time.sleep(120)\n"
    ))
    started = time.monotonic()
    run = _launch("-n", "2", "--grace", "2", str(script), timeout=60)
    assert run.returncode == 3
    assert time.monotonic() - started < 60
    assert "rank 1 exited with status 3; stopping the others" in run.stdout
    pid = int((tmp_path / "pid-0").read_text())
    assert not _alive(pid)


def test_launcher_times_out_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    script = _script(tmp_path, (
        f"open(os.path.join({str(tmp_path)!r}, f'pid-{{rank}}'), 'w').write(str(os.getpid()))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    ))
    run = _launch("-n", "2", "--timeout", "3", "--grace", "1", str(script), timeout=60)
    assert run.returncode == 124 and "timeout after 3.0 s" in run.stdout
    for rank in range(2):
        assert not _alive(int((tmp_path / f"pid-{rank}").read_text()))
        (tmp_path / f"pid-{rank}").unlink()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hloalias.tools.launch", "-n", "2", "--grace", "1", str(script)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert launcher.stdout is not None
        seen = 0
        while seen < 2:  # both ranks run
            line = launcher.stdout.readline()
            assert line, "the launcher ended before its ranks were ready"
            seen += "ready" in line
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 130
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    for rank in range(2):
        assert not _alive(int((tmp_path / f"pid-{rank}").read_text()))


def test_child_environment_replaces_the_device_count() -> None:
    env = child_environment(
        {"XLA_FLAGS": "--xla_dump_to=/x --xla_force_host_platform_device_count=4"}, 1, 2, "h", 9, 2
    )
    assert env["XLA_FLAGS"] == "--xla_dump_to=/x --xla_force_host_platform_device_count=2"
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "2", "h", "9")
    assert 0 < free_port() < 65536
