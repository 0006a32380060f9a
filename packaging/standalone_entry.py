"""Entry point of the standalone (PyInstaller) app: the same `localspec` command line."""

from localspec.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
