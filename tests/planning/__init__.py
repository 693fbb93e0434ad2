"""Tests of planning/."""
