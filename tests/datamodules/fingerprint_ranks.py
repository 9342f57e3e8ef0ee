"""``python -m tests.datamodules.fingerprint_ranks RANK WORLD INIT_FILE FINGERPRINT...``: one rank of a real gloo
group comparing each of its data fingerprints in turn with the other ranks' (:func:`datamodules.fingerprint.
same_data_on_every_rank`): per comparison, ``same`` on stdout or the one-line error on stderr; exit 2 after any
error, else 0. The group outlives a refused comparison: the next one still runs on every rank."""

from __future__ import annotations

import sys

import torch.distributed as dist

from datamodules.fingerprint import same_data_on_every_rank


def main() -> int:
    rank, world, init_file, fingerprints = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    code = 0
    try:
        for fingerprint in fingerprints:
            try:
                same_data_on_every_rank(fingerprint, f"text shards /data/text/corpus (rank {rank}'s copy)")
                print("same", flush=True)
            except ValueError as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
                code = 2
    finally:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
