"""What the tests share: the agent rig, waiting, fault injection, the fakes, the journal audit.

Test modules import from here and never from one another.
"""
