"""mixgate: the command line that ties gateway/, engine/, policies/ and bench/ together."""
