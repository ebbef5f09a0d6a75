"""Power-loss testing: record a workload's file operations, build the states a crash may leave."""
