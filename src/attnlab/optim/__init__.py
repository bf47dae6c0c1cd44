"""Optimizer parameter groups and learning-rate schedules."""
