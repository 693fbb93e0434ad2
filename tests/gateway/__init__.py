"""Tests of gateway/: real redis-server and real `mixgate serve` processes where they run here."""
