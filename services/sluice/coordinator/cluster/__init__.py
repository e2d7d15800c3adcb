"""Cluster metadata: broker and dispatcher registration and liveness, topics and their placement.

``state.ClusterState`` is the pure state machine; ``records`` its persisted record types; ``placement`` the
pure placement and routing functions; ``sessions`` soft liveness; ``model`` the domain values.
"""
