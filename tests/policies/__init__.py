"""Tests of policies/."""
