"""Suite-wide test setup: a fixed RNG per test, and how the tests share the cores (pytest-xdist).

``python -m pytest`` runs the suite on one worker process per core (``-n auto`` in pyproject.toml):

- each worker gets an equal share of the cores for torch's intra-op threads and the BLAS, and so do the
  processes its tests start, so two workers never fight over the same core;
- tests that use a module-scoped fixture run on one worker, back to back, so the fixture (often a
  trained run) is built once, as in a serial run; tests marked ``xdist_group(PROCESSES)`` (several
  busy processes at once: DDP ranks, parallel sweep runs) run one after another, never two at a time;
- the work is handed out longest first, so no long stretch starts last while the other workers idle: the
  ``PROCESSES`` group (one worker runs it from the start, a few minutes of one-after-another), then the ``slow``
  tests, then the tests that share a module fixture, then the rest (pyproject.toml turns off xdist's own
  reordering by test count, which handed the PROCESSES group out third, after test_bad_input.py's and
  test_config_checks.py's groups, so it began only when one of those had finished).

``python -m pytest -n 0`` runs everything in this one process (for ``--pdb``), in file order.
"""

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The xdist group of tests that keep several processes busy at once (DDP ranks, parallel sweep runs).
PROCESSES = "processes"
_SHARED_SCOPES = ("module", "class")


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # this is one of several xdist workers: its share of the cores
        from threadpoolctl import threadpool_limits

        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        threadpool_limits(share)  # numpy's BLAS (FID's eigenproblems) too: idle BLAS threads spin on a busy core
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(share))  # and the processes a test starts (runs, DDP ranks, sweeps)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # a serial run keeps file order
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    # Stable: longest work first (see the docstring), each group of tests still in file order.
    items.sort(key=_hand_out_order)


# Every test of this module is in the PROCESSES group (its pytestmark): its ids must carry "@processes".
_GROUPED_MODULE = "tests/experiments/test_parallel.py::"


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """The groups above only hold if pytest-xdist really put each test's group into its id (``id@group``): it
    writes a private attribute of pytest's Node, which pytest 9.2 renamed, and then every group is silently
    ignored (each test handed out alone: module fixtures built on every worker, busy-process tests side by side).
    The run stops at once instead (requirements.txt pins a pytest and pytest-xdist that work together)."""
    lost = [i for i in ids if i.startswith(_GROUPED_MODULE) and "@" not in i]
    if lost and node.config.getvalue("dist") == "loadgroup":
        raise pytest.UsageError(
            f"pytest-xdist's --dist loadgroup dropped the xdist_group of {lost[0]} (pytest {pytest.__version__}): "
            "install requirements.txt's pytest and pytest-xdist"
        )


def _hand_out_order(item: pytest.Item) -> int:
    """0 for the PROCESSES group, 1 for a slow test, 2 for one sharing a module fixture, 3 for the rest."""
    group = item.get_closest_marker("xdist_group")
    if group is not None and (group.args or [group.kwargs.get("name")])[0] == PROCESSES:
        return 0
    if item.get_closest_marker("slow") is not None:
        return 1
    return 2 if group is not None else 3


DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK")


@pytest.fixture(autouse=True)
def no_process_group_left_behind(request):
    """A test that leaves torch's default process group initialized, or the rendezvous variables Lightning sets
    for it (a process started later with LOCAL_RANK set waits for ranks nobody launches), would break the tests
    after it in this worker: the group is destroyed and the variables put back, and the test named."""
    before = {name: os.environ.get(name) for name in DIST_ENV}
    yield
    import torch.distributed as dist

    leaked = dist.is_available() and dist.is_initialized()
    if leaked:
        dist.destroy_process_group()
    for name, value in before.items():
        if os.environ.get(name) != value:
            leaked = True
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    if leaked:
        warnings.warn(f"{request.node.nodeid} left a process group or its variables behind (undone)", stacklevel=1)


@pytest.fixture(autouse=True)
def seed_torch():
    """Every test starts from the same RNG state, so random inputs and weights are reproducible."""
    torch.manual_seed(0)
    yield
