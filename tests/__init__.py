"""pipeforge's tests: a package, so helpers are imported by their full name (tests.sim.sim_orders)
however pytest is run."""
