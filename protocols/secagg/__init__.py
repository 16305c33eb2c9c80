"""SecAgg (Bonawitz et al. 2017) and SecAgg+ (Bell et al. 2020): state machines, wire format, graph."""
