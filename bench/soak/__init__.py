"""The soak: a long run at a steady load, judged on leaks and losses."""
