"""Reproduce the Entrain paper's evaluation in simulation (same as ``entrain bench paper``).

    python benchmarks/paper_reproduction.py            # full run, writes benchmarks/results/paper_reproduction.{md,json}
    python benchmarks/paper_reproduction.py --quick    # one case, two iterations

Every number comes from one discrete-event simulator run on each system's own Plan; the report
puts the paper's numbers beside ours and states which targets are met.
"""

import sys

from entrain.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "paper", *sys.argv[1:]]))
