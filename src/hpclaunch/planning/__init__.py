"""A request -> a checked JobSpec: resources, validation, dependencies."""
