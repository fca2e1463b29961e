"""Infrastructure shared by the stages, with no knowledge of any stage.

``processes``: starting child processes so that they end with their owner, and stopping trees.
Reads and writes nothing of its own.
"""
