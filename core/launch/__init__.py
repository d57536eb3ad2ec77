"""Launching: the plan a backend returns, the target script, and one executor per engine."""

from .plan import ENGINES, LaunchPlan, Rendezvous, Target, elastic_plan

__all__ = ["ENGINES", "LaunchPlan", "Rendezvous", "Target", "elastic_plan"]
