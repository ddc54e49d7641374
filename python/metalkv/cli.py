"""The `metalkv` command line."""
from __future__ import annotations

import argparse
import sys


def cmd_devices(args: argparse.Namespace) -> int:
    import metalkv

    for kind in metalkv.devices():
        dev = metalkv.device(kind)
        print(f"{kind}: {dev.name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metalkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("devices", help="list the devices metalkv can run on").set_defaults(fn=cmd_devices)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
