"""Other engines behind mixgate's AsyncEngine interface."""
