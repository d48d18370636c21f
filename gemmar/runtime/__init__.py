"""How ranks run: ipyparallel engines (engines), what runs inside each (rank), the one launcher (launch), what a
rank sends back (results) and the symmetric heap with its backends (heap/)."""
