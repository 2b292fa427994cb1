"""The peers of the side-by-side benchmark (DBOS, LangGraph) and the workload they share."""
