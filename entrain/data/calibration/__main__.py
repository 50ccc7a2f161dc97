"""``python -m entrain.data.calibration [--update]``: bounds vs values measured now."""

import sys

from entrain.data.calibration import report

print(report(update="--update" in sys.argv[1:]))
