"""`strata bench`: scenarios, the runner, metrics and the roofline explanation."""
