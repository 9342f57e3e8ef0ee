"""Init time and peak host memory of one rank of an LM config, built in full or on the meta device.

One process plays rank ``--rank`` of ``--world`` with torch's fake process group (no collective runs), builds the
config's ``LanguageModeling`` task as ``fit`` would and runs its ``configure_model`` on a (world, 1) mesh:
parallelize, then (``--meta``) materialize this rank's shards. Prints one JSON line: seconds from the first
constructor to the end of ``configure_model``, the process's resident memory before the build and its peak
(``ru_maxrss``), and the parameter bytes this rank holds. ``--depth`` overrides the trunk depth, so a config too big
for this host can be measured at two depths and extrapolated (memory and time grow linearly with the blocks)::

    python scripts/meta_init_cost.py configs/lm/olmo-1b.yaml --meta
    python scripts/meta_init_cost.py configs/lm/moe-15a2b.yaml --meta --depth 2
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402


def rss_mib() -> float:
    """The process's resident memory now (``/proc/self/statm``), in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--meta", action="store_true", help="model.init_args.meta_init=true")
    parser.add_argument("--depth", type=int, default=None)
    args = parser.parse_args()

    from experiments.parallel import ParallelConfig
    from experiments.tasks import LanguageModeling
    from experiments.tasks.optim import OptimConfig
    from models import TrunkConfig

    config = yaml.safe_load(args.config.read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    trunk = dict(model["trunk"], **({"depth": args.depth} if args.depth else {}))
    fields = ParallelConfig.__dataclass_fields__  # keys this checkout knows (an older one has fewer)
    parallel = ParallelConfig(**{k: v for k, v in model.get("parallel", {}).items() if k in fields})
    extra = {"meta_init": True} if args.meta else {}
    dist.init_process_group("fake", rank=args.rank, world_size=args.world, store=FakeStore())
    mesh = init_device_mesh("cpu", (args.world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    torch.manual_seed(config.get("seed_everything", 0))
    before = rss_mib()
    start = time.perf_counter()
    task = LanguageModeling(TrunkConfig(**trunk), OptimConfig(), vocab_size=data.get("bpe_vocab_size", 256),
                            seq_len=data["seq_len"], tie_embeddings=model.get("tie_embeddings", False),
                            parallel=parallel, **extra)  # fmt: skip
    task._device_mesh = mesh  # what ModelParallelStrategy sets before it calls configure_model
    task.configure_model()
    seconds = time.perf_counter() - start
    held = sum((p._local_tensor if isinstance(p, DTensor) else p).nbytes for p in task.net.parameters())
    largest = max(p.numel() for p in task.net.parameters()) * 4
    print(json.dumps({
        "config": str(args.config), "depth": trunk["depth"], "world": args.world, "rank": args.rank,
        "meta_init": args.meta, "init_s": round(seconds, 1), "rss_before_mib": round(before),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rank_params_mib": round(held / 2**20), "largest_param_mib": round(largest / 2**20),
    }))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
