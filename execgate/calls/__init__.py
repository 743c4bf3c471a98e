"""Tool calls as both front doors see them: `docker exec` (runtime/) and inside agents (daemon/).

One record, one hint rule, one outcome and journal line, one way of telling the agent: a call
journals and reads alike whichever door it came in by. Imports only common/ and cgroups/.
"""
