"""The recipe search: from a failing fp32/quantized pair to ``quantize_static`` arguments that pass,
verified with onnxruntime on held-out records on every deployment target (docs/recipe.md)."""

from pytest_qaccuracy.analysis.recipe.checks import Check, parse_checks
from pytest_qaccuracy.analysis.recipe.cost import CostModel, node_work
from pytest_qaccuracy.analysis.recipe.edit import GlobalEdits
from pytest_qaccuracy.analysis.recipe.measure import HOST, Evaluator, check_targets
from pytest_qaccuracy.analysis.recipe.search import Budget, RecipeResult, Step, search_recipe
from pytest_qaccuracy.analysis.recipe.space import Recipe, python_snippet

__all__ = [
    "HOST",
    "Budget",
    "Check",
    "CostModel",
    "Evaluator",
    "GlobalEdits",
    "Recipe",
    "RecipeResult",
    "Step",
    "check_targets",
    "node_work",
    "parse_checks",
    "python_snippet",
    "search_recipe",
]
