"""What Spark or the JVM said when something failed, as one line: the Spark commands (``fairqueue archive``,
``fairqueue report``) print no tracebacks, so every Spark failure they report goes through here. Also what
PySpark needs of Java (:data:`MIN_JAVA`), which :func:`fairqueue.spark.session.check_java` checks."""

from __future__ import annotations

from typing import Any

from fairqueue.text import one_line

_JVM_GONE = (
    "OutOfMemoryError",
    "stopped SparkContext",
    "SparkContext was shut down",
    "SparkContext has been shutdown",
    "Answer from Java side is empty",
    "Error while sending or receiving",
    "An error occurred while trying to connect to the Java server",
)
MEMORY_HINT = "raise spark.driver.memory (--conf spark.driver.memory=4g)"
MIN_JAVA = 17  # PySpark 4 runs on Java 17 or later
JAVA_NEEDED = f"PySpark needs Java {MIN_JAVA} or later"
JAVA_HINT = (
    f"install Java {MIN_JAVA}+ (e.g. apt-get install openjdk-{MIN_JAVA}-jre-headless) and set JAVA_HOME to its "
    "directory or put its bin/java first on PATH"
)


def spark_message(exc: BaseException) -> str:
    """The first line of what Spark or the JVM said about ``exc``: the Java exception's ``toString()``, else its
    ``getMessage()``, else ``str(exc)``, the first that is not empty; else the exception's type."""
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    if java is None:
        java = getattr(exc, "_origin", None)  # pyspark's captured exceptions (their getMessage() may be "")
    tries: list[Any] = []
    if java is not None:
        tries.append(java.toString)
    message = getattr(exc, "getMessage", None)
    if callable(message):
        tries.append(message)
    tries.append(lambda: str(exc))
    for attempt in tries:
        try:
            text = one_line(str(attempt() or ""), max_lines=3, limit=300)
        except Exception:  # noqa: S112 - the next source is the fallback
            continue
        if text:
            return text
    return type(exc).__name__


def spark_failure(exc: BaseException) -> str:
    """:func:`spark_message`, and what to do when the JVM ran out of memory or stopped."""
    text = spark_message(exc)
    try:
        whole = f"{text} {exc}"
    except Exception:  # a py4j error's text comes from the JVM, which may be gone
        whole = text
    if any(sign in whole for sign in _JVM_GONE) or type(exc).__name__ == "Py4JNetworkError":
        return f"{text} (Spark ran out of memory or stopped: {MEMORY_HINT})"
    if "JAVA_GATEWAY_EXITED" in whole:  # Spark's JVM did not start: most often no Java, or too old a one
        return f"{text} ({JAVA_NEEDED}: {JAVA_HINT})"
    return text
