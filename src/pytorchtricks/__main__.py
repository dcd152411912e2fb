"""``python -m pytorchtricks ...``: the ``ptt`` command (what ``torchrun -m pytorchtricks pack ... --distributed`` runs)."""

from pytorchtricks.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
