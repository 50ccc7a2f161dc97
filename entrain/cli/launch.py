"""torchrun as ``entrain train --nproc N`` starts it: ``python -m entrain.cli.launch TORCHRUN-ARGS``.

The same launcher as ``python -m torch.distributed.run`` (``torch.distributed.run.run``), made quiet
for a user: torch's elastic agent logs nothing below CRITICAL and a failed worker is no
``ChildFailedError`` traceback, only an exit status, the first failed worker's (``ERROR_EXIT`` = 2
for an Entrain error, ``INTERRUPTED_EXIT`` = 130 for Ctrl-C). The workers write their error
messages to files in ``$ENTRAIN_ERROR_DIR`` (``entrain.cli.train``), which the parent prints once.
"""

from __future__ import annotations

import logging
import os
import sys

ERROR_EXIT = 2
INTERRUPTED_EXIT = 130


def main(argv: list[str]) -> int:
    previous = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = "CRITICAL"  # read when torch's elastic loggers are created (at import)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if previous is None:  # the workers inherit the environment: leave theirs as it was
        del os.environ["LOGLEVEL"]
    else:
        os.environ["LOGLEVEL"] = previous
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else 1
    except (SignalException, KeyboardInterrupt):
        return INTERRUPTED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
