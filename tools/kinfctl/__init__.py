"""Kinference."""
