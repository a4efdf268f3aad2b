"""Tools around the runtime that generated code does not import: launching local process groups, the check
behind ``pipeforge run`` and the demo models it checks, profiling a model's stage costs, timing schedules'
steps, and ``pipeforge diagnose`` reading the records a failed step's ranks left."""
