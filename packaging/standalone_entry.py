"""Entry point of the standalone (PyInstaller) app: the same `localspec` command line.

`--template-probe` is internal: the app's own executable stands in for `python -I
template_sandbox.py --probe` (a frozen app has no separate interpreter to run the chat-template probe).
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:] == ["--template-probe"]:
        from localspec.engine.template_sandbox import probe_main

        raise SystemExit(probe_main())
    from localspec.cli import main

    raise SystemExit(main())
