"""Tools around the runtime that generated code does not import: launching local process groups, the check
behind ``pipeforge run``, the demo models it checks, and profiling a model's stage costs."""
