"""``python -m entrain ...`` (what ``torchrun -m entrain train`` runs)."""

from entrain.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
