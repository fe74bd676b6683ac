"""``python -m mnpar.checkpoint``: list a checkpoint, or consolidate it into one npz.

::

    python -m mnpar.checkpoint list result/checkpoint_iter_100
    python -m mnpar.checkpoint consolidate result/checkpoint_iter_100 model.npz
    python -m mnpar.checkpoint consolidate result/checkpoint_iter_100 trainer.npz --trainer
"""
import argparse
import sys
from typing import List, Optional

from ._errors import CheckpointError
from ._tool import consolidate, listing


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mnpar.checkpoint",
                                     description="List or consolidate an mnpar checkpoint.")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("list", help="what the checkpoint holds")
    show.add_argument("path")
    merge = sub.add_parser("consolidate", help="write it as one chainer npz")
    merge.add_argument("path")
    merge.add_argument("out")
    merge.add_argument("--trainer", action="store_true",
                       help="a trainer snapshot (load_npz(out, trainer)), not the model alone")
    merge.add_argument("--optimizer", default="main",
                       help="whose model to write (default: main)")
    merge.add_argument("--rank", type=int, default=None,
                       help="whose copy of a value the ranks held differently to take")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(listing(args.path))
        else:
            arrays = consolidate(args.path, args.out, "trainer" if args.trainer else "model",
                                 args.optimizer, args.rank)
            print(f"wrote {args.out}: {len(arrays)} arrays")
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
