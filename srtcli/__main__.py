"""`python -m srtcli ...` (what `torchrun -m srtcli` runs) is the same as `srt ...`."""

from srtcli.cli import main

if __name__ == "__main__":
    main()
