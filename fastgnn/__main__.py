"""`fastgnn` command line: `fastgnn bench ...` (also `python -m fastgnn.bench`)."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fastgnn bench [options]   (see fastgnn bench --help)")
        return 0
    if argv[0] == "bench":
        from .bench.__main__ import main as bench_main
        return bench_main(argv[1:])
    print(f"fastgnn: unknown command {argv[0]!r}; try 'fastgnn bench --help'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
