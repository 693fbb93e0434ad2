"""Run folders: summaries, the markdown report, the plots."""
