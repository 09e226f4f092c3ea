"""The tools' JSON schemas (what the model sees) and the validator of model arguments against those same dicts.

The validator understands exactly the JSON-schema keywords the schemas use (:data:`SUPPORTED_KEYWORDS`);
a schema with any other keyword is refused when it is built, so the model is never shown a rule the
validator does not enforce.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from .base import KIB, MIB, ToolCallError, ToolLimits, quoted, size_text

TOOL_NAMES: tuple[str, ...] = ("read", "write", "edit", "ls", "find", "grep", "exec")

MAX_PATH_CHARS = 4096
MAX_CONTENT_CHARS = 8 * MIB
MAX_COMMAND_CHARS = 64 * KIB
MAX_PATTERN_CHARS = 4 * KIB
MAX_EDITS = 50
MAX_ENV_ENTRIES = 64
MAX_ENV_VALUE_CHARS = 32 * KIB
MAX_PAGE_LIMIT = 10_000
MAX_GREP_LIMIT = 1000
MAX_GREP_CONTEXT = 20
# Bounds the JSON text parsed at all; every string in it has its own limit above.
MAX_RAW_ARGUMENTS_CHARS = 32 * MIB

SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "minimum",
        "maximum",
        "maxLength",
        "items",
        "minItems",
        "maxItems",
        "maxProperties",
    }
)

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
}


def _string(description: str, max_length: int) -> dict[str, Any]:
    return {"type": "string", "description": description, "maxLength": max_length}


def _integer(description: str, minimum: int, maximum: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description, "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _path(description: str) -> dict[str, Any]:
    return _string(description, MAX_PATH_CHARS)


def tool_schemas(limits: ToolLimits) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each tool's (description, parameters schema), with the defaults and maxima of ``limits``."""
    schemas = {
        "read": (
            f"Read a text file in the workspace. Returns at most {limits.read_max_lines} lines or "
            f"{size_text(limits.read_max_bytes)}, whichever comes first; when more remains, the text ends with "
            "a note giving the offset to continue from.",
            _object(
                {
                    "path": _path("File path, relative to the workspace root."),
                    "offset": _integer("Line number to start reading from (1-based; default 1).", 1),
                    "limit": _integer("Maximum number of lines to read.", 1),
                },
                ("path",),
            ),
        ),
        "write": (
            "Create or overwrite a file in the workspace with the given content. Missing parent directories "
            "are created.",
            _object(
                {
                    "path": _path("File path, relative to the workspace root."),
                    "content": _string("The file's complete new content.", MAX_CONTENT_CHARS),
                },
                ("path", "content"),
            ),
        ),
        "edit": (
            "Edit a file by exact text replacement. Each oldText must occur exactly once in the original file "
            "(include enough surrounding lines to make it unique) and edits must not overlap. All edits are "
            "applied together, or none is.",
            _object(
                {
                    "path": _path("File path, relative to the workspace root."),
                    "edits": {
                        "type": "array",
                        "description": "Replacements, each matched against the original file.",
                        "minItems": 1,
                        "maxItems": MAX_EDITS,
                        "items": _object(
                            {
                                "oldText": _string("Exact text to replace.", MAX_CONTENT_CHARS),
                                "newText": _string("Text to put in its place.", MAX_CONTENT_CHARS),
                            },
                            ("oldText", "newText"),
                        ),
                    },
                },
                ("path", "edits"),
            ),
        ),
        "ls": (
            "List a directory: entries sorted by name, directories marked with a trailing '/', dotfiles "
            f"included, {limits.ls_limit} per page by default. When more remain, the text ends with the "
            "'after' value for the next page.",
            _object(
                {
                    "path": _path("Directory, relative to the workspace root (default: the root)."),
                    "limit": _integer(f"Maximum entries to return (default {limits.ls_limit}).", 1, MAX_PAGE_LIMIT),
                    "after": _string("Return entries after this name (from the previous page).", MAX_PATH_CHARS),
                }
            ),
        ),
        "find": (
            "Find files and directories by glob pattern. A pattern without '/' matches names at any depth "
            "('*.py'); one with '/' matches the path relative to the search directory ('src/**/*.ts'). Returns "
            "sorted paths relative to the search directory (directories end with '/'); .git is skipped.",
            _object(
                {
                    "pattern": _string(
                        "Glob pattern: * ? [abc] and ** (any number of directories).", MAX_PATTERN_CHARS
                    ),
                    "path": _path("Directory to search in (default: the workspace root)."),
                    "limit": _integer(f"Maximum results (default {limits.find_limit}).", 1, MAX_PAGE_LIMIT),
                },
                ("pattern",),
            ),
        ),
        "grep": (
            "Search file contents for a regular expression (Python syntax) or a literal string. Returns "
            "'path:line: text' for each matching line, path relative to the directory searched ('path-line- text' "
            "for context lines); .git, binary "
            f"files and files over {size_text(limits.grep_max_file_bytes)} are skipped.",
            _object(
                {
                    "pattern": _string("Regular expression, or literal text with literal=true.", MAX_PATTERN_CHARS),
                    "path": _path("File or directory to search (default: the workspace root)."),
                    "glob": _string(
                        "Only search files matching this glob, e.g. '*.py' or 'src/**/*.ts'.", MAX_PATTERN_CHARS
                    ),
                    "ignoreCase": {"type": "boolean", "description": "Match case-insensitively."},
                    "literal": {"type": "boolean", "description": "Treat pattern as literal text, not a regex."},
                    "context": _integer("Lines of context before and after each match.", 0, MAX_GREP_CONTEXT),
                    "limit": _integer(f"Maximum matches (default {limits.grep_limit}).", 1, MAX_GREP_LIMIT),
                },
                ("pattern",),
            ),
        ),
        "exec": (
            "Run a shell command (/bin/sh -c) in the workspace. stdin is empty; stdout and stderr are combined. "
            f"Output over {size_text(limits.result_max_bytes)} keeps its start and end. The command is stopped "
            f"after timeoutSeconds (default {limits.exec_timeout_s:g}).",
            _object(
                {
                    "command": _string("The shell command.", MAX_COMMAND_CHARS),
                    "workdir": _path("Working directory, relative to the workspace root (default: the root)."),
                    "env": {
                        "type": "object",
                        "description": "Extra environment variables (PATH and loader variables are refused).",
                        "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_CHARS},
                        "maxProperties": MAX_ENV_ENTRIES,
                    },
                    "timeoutSeconds": {
                        "type": "number",
                        "description": f"Timeout in seconds (default {limits.exec_timeout_s:g}).",
                        "minimum": 1,
                        "maximum": limits.exec_max_timeout_s,
                    },
                },
                ("command",),
            ),
        ),
    }
    for _description, parameters in schemas.values():
        check_schema(parameters)
    return schemas


def tool_specs(names: Iterable[str] = TOOL_NAMES, *, limits: ToolLimits | None = None) -> list[dict[str, Any]]:
    """OpenAI chat-completions ``tools`` entries for ``names``, in that order."""
    schemas = tool_schemas(limits or ToolLimits())
    specs = []
    for name in names:
        if name not in schemas:
            raise ValueError(f"unknown tool {name!r}")
        description, parameters = schemas[name]
        specs.append(
            {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
        )
    return specs


def check_schema(schema: dict[str, Any]) -> None:
    """Refuse a schema using a keyword (or type) the validator would not enforce."""
    unsupported = set(schema) - SUPPORTED_KEYWORDS
    if unsupported or schema.get("type") not in _TYPE_NAMES:
        raise ValueError(
            f"schema uses what the validator does not enforce: {sorted(unsupported) or schema.get('type')}"
        )
    for child in schema.get("properties", {}).values():
        check_schema(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            check_schema(schema[key])


# --- validation -------------------------------------------------------------------------------------------


class SchemaViolation(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _label(where: str) -> str:
    return f'"{where}"' if where else "arguments"


def validated(schema: dict[str, Any], value: Any, where: str = "") -> Any:
    """``value`` checked against ``schema``, as a fresh copy (integral numbers given for integers become
    ints); raises :class:`SchemaViolation` naming the first problem found."""
    kind = schema["type"]
    label = _label(where)
    if kind == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaViolation(f"{label} must be an integer, not {_json_type(value)}")
    elif kind == "number":
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise SchemaViolation(f"{label} must be a finite number, not {_json_type(value)}")
    elif kind == "string":
        if not isinstance(value, str):
            raise SchemaViolation(f"{label} must be a string, not {_json_type(value)}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaViolation(f"{label} is too long (at most {schema['maxLength']} characters)")
        if _LONE_SURROGATE.search(value):
            # JSON can spell one ("\ud800"); no file, command or environment can hold it.
            raise SchemaViolation(f"{label} is not valid Unicode text (it holds a lone surrogate)")
        return value
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise SchemaViolation(f"{label} must be a boolean, not {_json_type(value)}")
        return value
    elif kind == "array":
        return _validated_array(schema, value, where)
    else:
        return _validated_object(schema, value, where)
    if "minimum" in schema and value < schema["minimum"]:
        raise SchemaViolation(f"{label} must be at least {schema['minimum']:g}")
    if "maximum" in schema and value > schema["maximum"]:
        raise SchemaViolation(f"{label} must be at most {schema['maximum']:g}")
    return value


def _validated_array(schema: dict[str, Any], value: Any, where: str) -> list[Any]:
    label = _label(where)
    if not isinstance(value, list):
        raise SchemaViolation(f"{label} must be an array, not {_json_type(value)}")
    if len(value) < schema.get("minItems", 0):
        raise SchemaViolation(f"{label} must have at least {schema['minItems']} item(s)")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise SchemaViolation(f"{label} must have at most {schema['maxItems']} items")
    return [validated(schema["items"], item, f"{where}[{index}]") for index, item in enumerate(value)]


def _validated_object(schema: dict[str, Any], value: Any, where: str) -> dict[str, Any]:
    label = _label(where)
    if not isinstance(value, dict):
        raise SchemaViolation(f"{label} must be an object, not {_json_type(value)}")
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    if extra is False:
        for key in value:
            if key not in properties:
                allowed = ", ".join(properties) or "none"
                raise SchemaViolation(f"unknown key {quoted(str(key))} in {label} (allowed: {allowed})")
    for key in schema.get("required", ()):
        if key not in value:
            raise SchemaViolation(f'"{_join(where, key)}" is required')
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        raise SchemaViolation(f"{label} must have at most {schema['maxProperties']} entries")
    result = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise SchemaViolation(f"{label} has a key that is not a string")
        child = properties.get(key, extra if isinstance(extra, dict) else None)
        result[key] = validated(child, item, _join(where, key)) if child is not None else item
    return result


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _refuse_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def decoded_arguments(name: str, raw: str | dict[str, Any]) -> dict[str, Any]:
    """The model's arguments for tool ``name`` as an object: its JSON text parsed, or the object it already is."""
    if isinstance(raw, str):
        if len(raw) > MAX_RAW_ARGUMENTS_CHARS:
            raise ToolCallError(f"invalid arguments for {name}: more than {MAX_RAW_ARGUMENTS_CHARS} characters")
        try:
            # Models send "" for a call without arguments.
            value = json.loads(raw, parse_constant=_refuse_constant) if raw.strip() else {}
        except RecursionError:
            raise ToolCallError(f"invalid arguments for {name}: nested too deeply") from None
        except json.JSONDecodeError as error:
            where = f"line {error.lineno} column {error.colno}"
            raise ToolCallError(f"invalid arguments for {name}: not valid JSON ({error.msg} at {where})") from None
        except ValueError as error:
            raise ToolCallError(f"invalid arguments for {name}: not valid JSON ({error})") from None
    else:
        value = raw
    if not isinstance(value, dict):
        raise ToolCallError(f"invalid arguments for {name}: expected a JSON object, not {_json_type(value)}")
    return value


def checked_arguments(name: str, arguments: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` validated against tool ``name``'s ``schema`` (a normalized copy)."""
    try:
        return validated(schema, arguments)
    except SchemaViolation as violation:
        raise ToolCallError(f"invalid arguments for {name}: {violation.message}") from None
