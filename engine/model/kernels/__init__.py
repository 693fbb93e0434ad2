"""The engine's own C kernels (compiled on the machine that runs them) and their torch bindings."""
