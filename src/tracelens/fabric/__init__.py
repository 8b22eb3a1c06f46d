"""The fabric view of a run, computed from the tables: counter deltas between successive
dumps (`deltas`) and the ports with their state and the ranks that use them (`ports`).

Rules and the report's fabric section both read the fabric through these functions,
so a number in a finding is the same number the report shows.
"""
