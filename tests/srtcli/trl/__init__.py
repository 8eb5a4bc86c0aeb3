"""Tests of srt inside TRL (`srtcli.trl`)."""
