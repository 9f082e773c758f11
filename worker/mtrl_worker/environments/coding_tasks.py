"""Small coding tasks whose public description leaves out details only the user knows.

Each `Fact` is one hidden detail: the simulated user reveals its answer when a question mentions
one of its keywords. The tests check the hidden details, so guessing without asking usually
fails some of them. `solution` is a reference implementation; the test suite checks it passes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    keywords: tuple[str, ...]
    answer: str


@dataclass(frozen=True)
class CodingTask:
    id: str
    description: str
    facts: tuple[Fact, ...]
    tests: tuple[tuple[str, str], ...]  # (call, expected Python literal or "!ValueError")
    solution: str


TASKS: tuple[CodingTask, ...] = (
    CodingTask(
        id="median",
        description="Write `median(values)` that returns the median of a list of numbers.",
        facts=(
            Fact(("empty", "no values", "nothing"), "For an empty list return None."),
            Fact(
                ("even", "two middle", "tie"),
                "With an even count, average the two middle values (a float).",
            ),
            Fact(
                ("none", "missing", "null", "skip", "ignore"),
                "None entries are missing values: ignore them.",
            ),
        ),
        tests=(
            ("median([3, 1, 2])", "2"),
            ("median([4, 1, 3, 2])", "2.5"),
            ("median([])", "None"),
            ("median([None, 5, None, 1, 3])", "3"),
            ("median([None])", "None"),
        ),
        solution=(
            "def median(values):\n"
            "    xs = sorted(v for v in values if v is not None)\n"
            "    if not xs:\n"
            "        return None\n"
            "    mid = len(xs) // 2\n"
            "    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2\n"
        ),
    ),
    CodingTask(
        id="slugify",
        description="Write `slugify(title)` that turns a title into a URL slug.",
        facts=(
            Fact(("case", "upper", "lower"), "Lower-case everything."),
            Fact(
                ("space", "separator", "dash", "hyphen"),
                "Words are joined by single hyphens; runs of spaces or hyphens collapse to one.",
            ),
            Fact(
                ("punctuation", "special", "symbol", "character"),
                "Drop every character that is not a letter, digit, space or hyphen.",
            ),
            Fact(
                ("length", "long", "limit", "max"),
                "At most 20 characters; cut at 20 and strip a trailing hyphen.",
            ),
        ),
        tests=(
            ("slugify('Hello World')", "'hello-world'"),
            ("slugify('  Many   spaces -- here ')", "'many-spaces-here'"),
            ("slugify('C++ & Rust: a tale!')", "'c-rust-a-tale'"),
            ("slugify('a very long title that goes on and on')", "'a-very-long-title-th'"),
            ("slugify('abcdefghijklmnopqrs tuv')", "'abcdefghijklmnopqrs'"),
        ),
        solution=(
            "import re\n"
            "def slugify(title):\n"
            "    kept = re.sub(r'[^a-z0-9 -]', '', title.lower())\n"
            "    slug = re.sub(r'[ -]+', '-', kept).strip('-')\n"
            "    return slug[:20].rstrip('-')\n"
        ),
    ),
    CodingTask(
        id="parse_duration",
        description="Write `parse_duration(text)` that parses a duration like '1h30m' into seconds.",
        facts=(
            Fact(
                ("unit", "suffix", "h", "hour", "second"),
                "Units are h, m and s; they may appear in any combination but in that order.",
            ),
            Fact(("bare", "plain", "number", "no unit", "without"), "A bare number means minutes."),
            Fact(
                ("invalid", "error", "bad", "wrong", "empty"),
                "Anything else, including an empty string, raises ValueError.",
            ),
        ),
        tests=(
            ("parse_duration('1h30m')", "5400"),
            ("parse_duration('45s')", "45"),
            ("parse_duration('2h5s')", "7205"),
            ("parse_duration('10')", "600"),
            ("parse_duration('')", "'!ValueError'"),
            ("parse_duration('5x')", "'!ValueError'"),
        ),
        solution=(
            "import re\n"
            "def parse_duration(text):\n"
            "    if re.fullmatch(r'\\d+', text):\n"
            "        return int(text) * 60\n"
            "    m = re.fullmatch(r'(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?', text)\n"
            "    if not text or not m:\n"
            "        raise ValueError(text)\n"
            "    h, mi, s = (int(g or 0) for g in m.groups())\n"
            "    return h * 3600 + mi * 60 + s\n"
        ),
    ),
    CodingTask(
        id="price_with_tax",
        description="Write `price_with_tax(amount, region)` that returns the price including sales tax.",
        facts=(
            Fact(
                ("rate", "percent", "tax", "region", "state"),
                "CA is 7.25%, NY is 4%, every other region is tax free.",
            ),
            Fact(("round", "decimal", "cents", "precision"), "Round to 2 decimals with round()."),
            Fact(("case", "lower", "upper"), "Region codes are case-insensitive."),
        ),
        tests=(
            ("price_with_tax(100, 'CA')", "107.25"),
            ("price_with_tax(19.99, 'ny')", "20.79"),
            ("price_with_tax(50, 'TX')", "50.0"),
            ("price_with_tax(10, 'ca')", "10.72"),
        ),
        solution=(
            "RATES = {'CA': 0.0725, 'NY': 0.04}\n"
            "def price_with_tax(amount, region):\n"
            "    rate = RATES.get(region.upper(), 0.0)\n"
            "    return round(amount * (1 + rate), 2)\n"
        ),
    ),
    CodingTask(
        id="top_words",
        description="Write `top_words(text)` that returns the most frequent words of a text.",
        facts=(
            Fact(
                ("how many", "number", "count", "top", "n"),
                "Return the top 3 (fewer if there are fewer distinct words).",
            ),
            Fact(("format", "return", "type", "output"), "A list of (word, count) tuples."),
            Fact(
                ("case", "upper", "lower", "punctuation"),
                "Case-insensitive; words are runs of letters a-z, everything else separates them.",
            ),
            Fact(("tie", "order", "sort", "equal"), "Higher count first; ties in alphabetical order."),
        ),
        tests=(
            ("top_words('b a b c a b')", "[('b', 3), ('a', 2), ('c', 1)]"),
            ("top_words('Dog, dog! CAT? cat; bird.')", "[('cat', 2), ('dog', 2), ('bird', 1)]"),
            ("top_words('one')", "[('one', 1)]"),
            ("top_words('z y x w')", "[('w', 1), ('x', 1), ('y', 1)]"),
        ),
        solution=(
            "import re\n"
            "from collections import Counter\n"
            "def top_words(text):\n"
            "    counts = Counter(re.findall(r'[a-z]+', text.lower()))\n"
            "    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]\n"
        ),
    ),
    CodingTask(
        id="normalize_phone",
        description="Write `normalize_phone(text)` that normalizes a US phone number.",
        facts=(
            Fact(("format", "output", "look", "style"), "Format as '(555) 123-4567'."),
            Fact(
                ("country", "leading", "+1", "code", "11"),
                "A leading country code 1 (11 digits) is dropped.",
            ),
            Fact(
                ("invalid", "error", "wrong", "bad", "short"),
                "Anything that is not 10 digits after that returns None.",
            ),
        ),
        tests=(
            ("normalize_phone('555 123 4567')", "'(555) 123-4567'"),
            ("normalize_phone('+1 (555) 123-4567')", "'(555) 123-4567'"),
            ("normalize_phone('555-1234')", "None"),
            ("normalize_phone('15551234567')", "'(555) 123-4567'"),
            ("normalize_phone('25551234567')", "None"),
        ),
        solution=(
            "def normalize_phone(text):\n"
            "    d = ''.join(c for c in text if c.isdigit())\n"
            "    if len(d) == 11 and d[0] == '1':\n"
            "        d = d[1:]\n"
            "    if len(d) != 10:\n"
            "        return None\n"
            "    return f'({d[:3]}) {d[3:6]}-{d[6:]}'\n"
        ),
    ),
)

TASKS_BY_ID = {task.id: task for task in TASKS}
