"""Exactly-once processing without broker transactions (``processing="exactly_once"``):
output stamped with its processor's attempt and committed by markers after the
processor's checkpoint (``writer``), and readers that apply a record only once its
attempt is committed (``reader``); ``markers`` is what both read and write."""
