"""Plan IR: schema and validation, JSON-Patch edits, expansion to launches."""
from conjugate.plan.blocks import Cross, ModelBlock, Override, Stream
from conjugate.plan.expand import Launch, Part, Schedule, check_dependencies, expand
from conjugate.plan.patch import apply_patch, patch_plan
from conjugate.plan.schema import SCHEMA, Plan, load_plan, plan_hash, validate_plan

__all__ = ["SCHEMA", "Cross", "Launch", "ModelBlock", "Override", "Part", "Plan", "Schedule", "Stream", "apply_patch",
           "check_dependencies", "expand", "load_plan", "patch_plan", "plan_hash", "validate_plan"]
