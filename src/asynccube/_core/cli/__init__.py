"""What ``python -m asynccube`` runs besides ``info``: the demo.

May import: everything below it.
"""
