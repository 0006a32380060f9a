"""The false-hit guard: facts two prompts must agree on before one's answer serves the other.

Embeddings score "sort ascending" and "sort descending" as near-duplicates, and "sum of 3 and 4"
against "sum of 3 and 5" even higher. Similarity alone cannot tell them apart, so a semantic hit
is served only when the prompts also agree on every detail that changes the answer:

- numbers (digits and number words), in order;
- quoted strings and code identifiers, case-sensitively;
- negation (not, without, except, avoid, ...);
- named entities (capitalised names), compared case-insensitively;
- languages, libraries and tools (a lexicon with aliases: js = javascript);
- direction words (ascending/descending, min/max, before/after, encode/decode, ...);
- the direction of a conversion ("X to Y" never serves "Y to X").

`compare` returns the first disagreement, or None when the prompts agree. It is deliberately
strict: a rejected paraphrase costs one generation, a served trap is a wrong answer.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9+#']*")

# ---------------------------------------------------------------- numbers

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "dozen": 12,
}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINALS = {
    "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9,
    "tenth": 10, "hundredth": 100, "thousandth": 1000,
}
_MULTIPLES = {"twice": 2, "triple": 3, "half": 0.5, "quarter": 0.25}
_NOT_COUNTING = {"which", "this", "that", "the", "each", "any", "every", "no", "some", "another", "one", "a", "only"}
_NUM_TOKEN = re.compile(
    r"(?<![A-Za-z_])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?:st|nd|rd|th)?(?![A-Za-z_])"
    r"|[A-Za-z]+",
)


def _num_str(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def numbers(text: str) -> tuple[str, ...]:
    """Numbers in order of appearance; number words become digits ("twenty five" -> 25)."""
    out: list[str] = []
    acc: float | None = None  # a number being spelled out in words

    def flush() -> None:
        nonlocal acc
        if acc is not None:
            out.append(_num_str(acc))
            acc = None

    prev = ""
    for m in _NUM_TOKEN.finditer(text):
        tok = m.group(0)
        low = tok.lower()
        if tok[0].isdigit() or tok[0] in "+-" and len(tok) > 1:
            flush()
            digits = re.sub(r"(st|nd|rd|th)$", "", tok.replace(",", ""))
            try:
                out.append(_num_str(float(digits)))
            except ValueError:
                out.append(digits)
        elif low in _UNITS:
            if low == "one" and (prev in _NOT_COUNTING or text[m.end():m.end() + 1] == "-"):
                flush()  # "which one", "one-liner": not a count
            elif acc is not None and ((acc % 10 == 0 and acc % 100 >= 20) or (acc >= 100 and acc % 100 == 0)):
                acc += _UNITS[low]
            else:
                flush()
                acc = _UNITS[low]
        elif low in _TENS:
            if acc is not None and acc % 100 != 0:
                flush()
            acc = (acc or 0) + _TENS[low]
        elif low in _SCALES and acc is not None:
            acc *= _SCALES[low]
        elif low in _SCALES:
            acc = _SCALES[low]
        elif low in _ORDINALS and not (low == "second" and prev in ("per", "a", "one", "each", "every")):
            flush()
            out.append(_num_str(_ORDINALS[low]))
        elif low in _MULTIPLES:
            flush()
            out.append(_num_str(_MULTIPLES[low]))
        elif low == "and" and acc is not None and acc >= 100:
            continue  # "one hundred and five"
        else:
            flush()
        prev = low
    flush()
    return tuple(out)


# ---------------------------------------------------------------- quoted strings, identifiers

_QUOTED = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|`([^`\n]+)`|‘([^’\n]+)’|(?<![\w])\'([^\'\n]+)\'(?![\w])')
_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
_FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
_FILE_EXT = re.compile(r"(?<![\w])\.[a-z0-9]{1,5}\b")


# CamelCase words that are names rather than identifiers.
_BRANDS = {"dataframe", "iphone", "ipad", "youtube", "github", "gitlab", "linkedin", "powershell", "macos",
           "javascript", "typescript", "postgresql", "mongodb", "pytorch", "numpy", "fastapi", "openai", "chatgpt",
           "mysql", "graphql", "jquery", "webassembly", "wordpress", "paypal", "playstation", "mcdonald",
           "mcdonald's", "ebay", "whatsapp", "tiktok", "bigquery", "dynamodb", "nodejs", "nextjs", "vscode"}


def quoted(text: str) -> frozenset[str]:
    return frozenset(next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(text))


def _is_code_word(w: str) -> bool:
    core = w[:-2] if w.endswith("()") else w
    if w.endswith("()"):
        return True
    if "_" in core.strip("_") or core.startswith("__"):
        return True
    # camelCase / PascalCase with an inner capital: getElementById, ArrayList (not "iPhone"-like words)
    return bool(re.search(r"[a-z][A-Z]", core)) and not core.isupper()


def identifiers(text: str) -> frozenset[str]:
    """snake_case, camelCase, calls, dotted names, command-line flags and file extensions."""
    found: set[str] = set()
    for m in _DOTTED.finditer(text):
        name = m.group(0).rstrip(".")
        if not re.fullmatch(r"[A-Z][a-z]+\.[A-Z][a-z]+", name):  # "Hello.World" sentence break
            found.add(name.removesuffix("()"))
    for m in re.finditer(r"[A-Za-z_][\w]*(?:\(\))?", text):
        w = m.group(0)
        if w.lower() in _TECH_ALIASES or w.lower() in _BRANDS:
            continue  # JavaScript, DataFrame: names, compared case-insensitively elsewhere
        if _is_code_word(w):
            found.add(w.removesuffix("()"))
    found.update(m.group(0) for m in _FLAG.finditer(text) if not re.fullmatch(r"-\w+", m.group(0)) or len(m.group(0)) <= 3)
    found.update(m.group(0) for m in _FILE_EXT.finditer(text))
    # A dotted name also contributes its parts; keep only the full names.
    return frozenset(found)


# ---------------------------------------------------------------- negation

_NEGATION = re.compile(
    r"\b(?:not|no|never|without|none|nothing|nobody|nowhere|neither|nor|cannot|except|excluding|exclude|"
    r"excludes|excluded|avoid|avoiding|prevent|preventing|ignore|ignoring|ignored|skip|skipping|unless|"
    r"lack|lacking|omit|omitting|isn't|aren't|wasn't|weren't|don't|doesn't|didn't|can't|won't|shouldn't|"
    r"wouldn't|couldn't|mustn't|haven't|hasn't|hadn't|non|un-|aside from|other than|instead of|rather than)\b",
    re.IGNORECASE,
)


def negated(text: str) -> bool:
    return bool(_NEGATION.search(text.replace("’", "'")))


# ---------------------------------------------------------------- directions

# Each group lists its poles; a prompt's poles per group must match the other's exactly.
_ITEMS = r"(?= (?:numbers?|integers?|ints?|indices|indexes|index|positions?|rows?|length|digits?|values?|elements?|entries|lines|items?))"
_DIRECTIONS: dict[str, dict[str, str]] = {
    "order": {
        "up": r"ascending|ascend|asc|increasing order|smallest to (?:the )?largest|lowest to (?:the )?highest|"
              r"low to high|a-z|a to z|oldest to (?:the )?newest|shortest to (?:the )?longest|alphabetical(?:ly)?",
        "down": r"descending|descend|desc|decreasing order|largest to (?:the )?smallest|highest to (?:the )?lowest|"
                r"high to low|z-a|z to a|newest to (?:the )?oldest|longest to (?:the )?shortest|"
                r"reverse(?:d)? alphabetical(?:ly)?",
    },
    "extreme": {
        "max": r"max|maximum|maximal|maximi[sz]e|largest|biggest|highest|greatest|longest|tallest|oldest|heaviest|"
               r"richest|fastest|deepest|farthest|furthest|hottest|upper bound|most (?:frequent|common|popular|used|often)",
        "min": r"min|minimum|minimal|minimi[sz]e|smallest|lowest|shortest|fewest|shallowest|youngest|lightest|"
               r"poorest|slowest|nearest|closest|coldest|cheapest|lower bound|least (?:frequent|common|popular|used|often)",
    },
    "compare": {
        "more": r"more than|greater than|larger than|bigger than|higher than|above|exceeds?|exceeding|at least|"
                r"older than|longer than",
        "less": r"less than|fewer than|smaller than|lower than|below|at most|younger than|shorter than",
    },
    "sequence": {"before": r"before|earlier than|prior to", "after": r"after|later than"},
    "position": {
        "first": r"first|beginning|starts? with|starting with|(?:the )?start of|prefix|leading|head|front|earliest",
        "last": r"last|ending|ends? with|ending with|suffix|trailing|tail|latest|final",
    },
    "letters": {"upper": r"upper ?case|uppercase|capitali[sz]e|capital letters|all caps",
             "lower": r"lower ?case|lowercase|small letters"},
    "side": {"left": r"left|lstrip|ljust", "right": r"right(?:-| )?(?:side|join|align(?:ed)?|shift|pad|most)|"
             r"to the right|rstrip|rjust"},
    "rounding": {"up": r"round(?:ing|ed)? up|ceil|ceiling", "down": r"round(?:ing|ed)? down|floor"},
    "parity": {"even": rf"even{_ITEMS}|is even|evens", "odd": rf"odd{_ITEMS}|is odd|odds"},
    "axis": {"row": r"rows?|row-wise", "column": r"columns?|cols?|column-wise"},
    "orientation": {"horizontal": r"horizontal(?:ly)?", "vertical": r"vertical(?:ly)?"},
    "truth": {"true": r"true|truthy", "false": r"false|falsy"},
    "compass": {"north": r"north(?:ern)?", "south": r"south(?:ern)?", "east": r"east(?:ern)?", "west": r"west(?:ern)?"},
    "temporal": {"past": r"yesterday|last (?:week|month|year)|ago", "future": r"tomorrow|next (?:week|month|year)|from now"},
    "sync": {"sync": r"synchronous(?:ly)?|sync|blocking", "async": r"asynchronous(?:ly)?|async|non-blocking"},
    "inout": {"in": r"inner|input|incoming|inbound", "out": r"outer|output|outgoing|outbound"},
    "global": {"global": r"global(?:ly)?", "local": r"local(?:ly)?"},
    "sign": {"positive": r"positive", "negative": r"negative"},
    "gain": {"profit": r"profit", "loss": r"loss"},
    "case": {"best": r"best[- ]case", "worst": r"worst(?:[- ]case)?"},
    # evaluative and physical antonyms: "is coffee good/bad for you", "a soft/hard yolk"
    "polarity": {"good": r"good for|healthy|beneficial|benefits?|advantages?|pros|safe|safer|helpful",
                 "bad": r"bad for|unhealthy|harmful|risks?|disadvantages?|cons|dangerous|unsafe|harmful|drawbacks?"},
    "hardness": {"soft": r"soft|softer|runny", "hard": r"hard-boiled|hard|harder|firm"},
    "heat": {"hot": r"hot|hotter|warm|warmer|heat", "cold": r"cold|colder|cool|cooler|chill(?:ed)?"},
    "brightness": {"light": r"light mode|light theme|bright", "dark": r"dark mode|dark theme|dark"},
    "client": {"client": r"client(?:-side)?", "server": r"server(?:-side)?"},
    "frontback": {"frontend": r"front-?end", "backend": r"back-?end"},
}

# Verb pairs whose two sides are opposite actions: the "change" group above is a single bag of verbs,
# so instead each verb maps to a canonical action and the actions must agree.
_ACTIONS: dict[str, str] = {}
for _pole, _words in {
    "add": "add adding adds added insert inserting inserts append appending appends push pushing include including",
    "remove": "remove removing removes removed delete deleting deletes deleted drop dropping pop popping "
              "strip stripping erase erasing discard discarding",
    "increase": "increase increasing increases increment incrementing raise raising grow growing enlarge expand "
                "expanding upscale",
    "decrease": "decrease decreasing decreases decrement decrementing lower lowering reduce reducing shrink "
                "shrinking downscale",
    "install": "install installing installs installed", "uninstall": "uninstall uninstalling uninstalls",
    "enable": "enable enabling enables enabled turn-on activate activating allow allowing whitelist", "disable": "disable disabling disables disabled block blocking deny forbid blacklist "
              "turn-off deactivate deactivating",
    "show": "show showing shows display displaying unhide reveal", "hide": "hide hiding hides conceal",
    "lock": "lock locking locks", "unlock": "unlock unlocking unlocks",
    "join": "join joining joins merge merging concatenate concatenating combine combining",
    "split": "split splitting splits separate separating divide",
    "mount": "mount mounting", "unmount": "unmount unmounting",
    "open": "open opening opens", "close": "close closing closes",
    "start": "start starting starts launch launching begin", "stop": "stop stopping stops kill killing terminate halt",
    "subscribe": "subscribe subscribing", "unsubscribe": "unsubscribe unsubscribing",
    "encrypt": "encrypt encrypting encrypts encryption", "decrypt": "decrypt decrypting decrypts decryption",
    "encode": "encode encoding encodes encoder", "decode": "decode decoding decodes decoder",
    "compress": "compress compressing compression zip zipping gzip", "decompress": "decompress decompressing "
                "decompression unzip unzipping extract extracting gunzip untar",
    "serialize": "serialize serialise serializing serialising serialization dump dumps dumping stringify",
    "deserialize": "deserialize deserialise deserializing deserialising deserialization parse parsing load loads loading",
    "upload": "upload uploading uploads", "download": "download downloading downloads",
    "import": "import importing imports", "export": "export exporting exports",
    "read": "read reading reads", "write": "write writing writes save saving",
    "send": "send sending sends", "receive": "receive receiving receives",
    "push": "push pushing", "pull": "pull pulling fetch fetching",
    "connect": "connect connecting connects", "disconnect": "disconnect disconnecting",
    "freeze": "freeze freezing", "unfreeze": "unfreeze unfreezing thaw",
    "wrap": "wrap wrapping", "unwrap": "unwrap unwrapping", "set": "set setting", "unset": "unset unsetting",
    "escape": "escape escaping", "unescape": "unescape unescaping",
    "buy": "buy buying purchase", "sell": "sell selling",
    "win": "win winning won", "lose": "lose losing lost",
}.items():
    for _w in _words.split():
        _ACTIONS[_w] = _pole
# Actions that are each other's opposite; only these can conflict.
_OPPOSITE_ACTIONS = {
    frozenset(p) for p in [
        ("add", "remove"), ("increase", "decrease"), ("install", "uninstall"), ("enable", "disable"),
        ("show", "hide"), ("lock", "unlock"), ("join", "split"), ("mount", "unmount"), ("open", "close"),
        ("start", "stop"), ("subscribe", "unsubscribe"), ("encrypt", "decrypt"), ("encode", "decode"),
        ("compress", "decompress"), ("serialize", "deserialize"), ("upload", "download"),
        ("import", "export"), ("read", "write"), ("send", "receive"), ("push", "pull"),
        ("connect", "disconnect"), ("freeze", "unfreeze"), ("wrap", "unwrap"), ("escape", "unescape"), ("set", "unset"),
        ("buy", "sell"), ("win", "lose"),
    ]
}


@lru_cache(maxsize=None)
def _pole_re(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])", re.IGNORECASE)


def directions(text: str) -> frozenset[tuple[str, str]]:
    """(group, pole) pairs the prompt mentions, e.g. ("order", "down")."""
    found: set[tuple[str, str]] = set()
    for group, poles in _DIRECTIONS.items():
        for pole, pattern in poles.items():
            if _pole_re(pattern).search(text):
                found.add((group, pole))
    return frozenset(found)


def actions(text: str) -> frozenset[str]:
    return frozenset(_ACTIONS[w] for w in re.findall(r"[a-z]+(?:-[a-z]+)?", text.lower()) if w in _ACTIONS)


# ---------------------------------------------------------------- languages, libraries, tools

_TECH_ALIASES: dict[str, str] = {}
for _canon, _aliases in {
    "python": "python python3 py cpython", "javascript": "javascript js ecmascript", "typescript": "typescript ts",
    "java": "java", "kotlin": "kotlin", "scala": "scala", "c": "", "c++": "c++ cpp", "c#": "c# csharp",
    "go": "golang", "rust": "rust", "ruby": "ruby", "php": "php", "perl": "perl", "lua": "lua",
    "haskell": "haskell", "elixir": "elixir", "erlang": "erlang", "clojure": "clojure", "julia": "julia",
    "r": "", "matlab": "matlab", "dart": "dart", "zig": "zig", "fortran": "fortran", "cobol": "cobol",
    "bash": "bash sh zsh shell", "powershell": "powershell", "sql": "sql", "html": "html", "css": "css",
    "swift": "", "objective-c": "objective-c objc",
    "postgres": "postgres postgresql psql", "mysql": "mysql mariadb", "sqlite": "sqlite sqlite3",
    "mongodb": "mongodb mongo", "redis": "redis", "elasticsearch": "elasticsearch", "cassandra": "cassandra",
    "pandas": "pandas pd", "numpy": "numpy np", "polars": "polars", "scipy": "scipy", "matplotlib": "matplotlib plt",
    "seaborn": "seaborn", "plotly": "plotly", "sklearn": "sklearn scikit-learn", "pytorch": "pytorch torch",
    "tensorflow": "tensorflow tf", "keras": "keras", "jax": "jax", "transformers": "huggingface",
    "react": "react reactjs", "vue": "vue vuejs", "angular": "angular", "svelte": "svelte", "jquery": "jquery",
    "django": "django", "flask": "flask", "fastapi": "fastapi", "express": "expressjs", "spring": "",
    "rails": "rails", "laravel": "laravel", "node": "node nodejs node.js", "deno": "deno", "bun": "",
    "docker": "docker dockerfile", "kubernetes": "kubernetes k8s kubectl", "git": "git github gitlab",
    "linux": "linux ubuntu debian", "windows": "windows", "macos": "macos osx mac", "android": "android",
    "ios": "ios", "aws": "aws s3 ec2 lambda", "gcp": "gcp", "azure": "azure", "terraform": "terraform",
    "ansible": "ansible", "nginx": "nginx", "apache": "apache", "excel": "excel", "vim": "vim neovim",
    "emacs": "emacs", "vscode": "vscode", "npm": "npm", "pip": "pip", "conda": "conda", "cargo": "cargo",
    "maven": "maven", "gradle": "gradle", "requests": "", "asyncio": "asyncio", "regex": "",
    "json": "json", "yaml": "yaml yml", "xml": "xml", "csv": "csv", "toml": "toml", "protobuf": "protobuf",
    "graphql": "graphql", "rest": "", "grpc": "grpc", "kafka": "kafka", "rabbitmq": "rabbitmq", "spark": "spark pyspark",
    "hadoop": "hadoop", "airflow": "airflow", "selenium": "selenium", "pytest": "pytest", "unittest": "unittest",
    "jest": "jest", "junit": "junit", "tailwind": "tailwind", "bootstrap": "bootstrap", "nextjs": "nextjs next.js",
    "opencv": "opencv cv2", "pillow": "pillow pil", "beautifulsoup": "beautifulsoup bs4", "sqlalchemy": "sqlalchemy",
    "celery": "celery", "httpx": "httpx", "aiohttp": "aiohttp", "urllib": "urllib urllib3",
    "axios": "axios", "lodash": "lodash", "pydantic": "pydantic", "boto3": "boto3", "podman": "podman", "latex": "latex", "markdown": "markdown", "unity": "", "unreal": "unreal",
}.items():
    for _a in (_aliases.split() or []):
        _TECH_ALIASES[_a] = _canon
    if _aliases and _canon not in ("go", "swift", "spring", "express", "bun", "requests", "rest", "unity", "c", "r"):
        _TECH_ALIASES.setdefault(_canon, _canon)
# English words that name a technology only when written with a capital (or unambiguously).
_TECH_CAPITAL_ONLY = {"C": "c", "R": "r", "Go": "go", "Swift": "swift", "Spring": "spring", "Express": "express",
                      "Bun": "bun", "Requests": "requests", "REST": "rest", "Unity": "unity", "Rust": "rust",
                      "Ruby": "ruby", "Julia": "julia", "Dart": "dart", "Node": "node", "Flask": "flask"}


def technologies(text: str) -> frozenset[str]:
    found: set[str] = set()
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#]|[A-Za-z]", text):
        w = m.group(0)
        if w in _TECH_CAPITAL_ONLY:
            found.add(_TECH_CAPITAL_ONLY[w])
            continue
        low = w.lower()
        if low in ("rust", "ruby", "julia", "dart", "flask", "node") and w[0].islower():
            continue  # plain English words unless capitalised
        if low in _TECH_ALIASES:
            found.add(_TECH_ALIASES[low])
        elif "." in low and low.split(".")[0] in _TECH_ALIASES and low not in _TECH_ALIASES:
            found.add(_TECH_ALIASES[low.split(".")[0]])  # np.sort -> numpy
    return frozenset(found)


# ---------------------------------------------------------------- named entities

# Capitalised words that start questions or are common enough not to name anything.
_NOT_ENTITIES = set(
    """
    a about above after again all also am an and any are as at be because been before being below between both
    but by can could did do does doing down during each few for from further had has have having he her here hers
    how i if in into is it its just me more most my no nor not now of off on once only or other our out over own
    please same she should so some such than that the their them then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you your yours
    explain tell give write show list describe define compare create make find get convert help implement
    calculate compute check print return use using need want let lets let's suppose imagine given assume
    is are was were can could should would will may might must shall do does did has have had
    what's how's where's who's why's whats hows which's i'm i've i'd yes ok okay hi hello hey thanks thank
    best way quick simple easy good fastest example examples difference meaning summary summarize
    translate rewrite fix debug generate build sort reverse count remove delete add read parse name
    one two three four five six seven eight nine ten first second third is there any anyone
    recommend suggest provide outline walk step steps
    """.split()
)


def entities(text: str) -> frozenset[str]:
    """Capitalised words and acronyms that are not sentence starters or technologies, folded."""
    found: set[str] = set()
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9'\-]*", text):
        w = m.group(0)
        if not (w[0].isupper() or (len(w) > 1 and w.isupper())):
            continue
        low = w.lower().removesuffix("'s")
        initial = m.start() == 0 or text[:m.start()].rstrip()[-1:] in (".", "?", "!", ":", "-")
        if initial and not w.isupper() and re.search(r"(?:ing|ed|ly)$", low):
            continue  # "Reading a CSV file...": a verb that starts the sentence
        if low in _NOT_ENTITIES or len(low) < 2 or w in _TECH_CAPITAL_ONLY or low in _TECH_ALIASES:
            continue
        found.add(low)
    return frozenset(found)


# ---------------------------------------------------------------- conversion direction

_ARTICLES = r"(?:(?:a|an|the|my|some|this|that|these|those|its|their|your)\s+)?"
_CONVERT = [
    re.compile(rf"\bfrom\s+{_ARTICLES}([\w+#.\-]+)\s+(?:to|into|in)\s+{_ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(rf"\b([\w+#.\-]+)\s+(?:to|into|->|→)\s+{_ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(rf"\b([\w+#.\-]+)\s+from\s+{_ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(r"\bhow many\s+([\w+#.\-]+)\s+(?:are|is)\s+(?:there\s+)?in\s+(?:[\d.,]+\s+)?([\w+#.\-]+)", re.IGNORECASE),
    # comparisons are ordered too: "X faster than Y" is not "Y faster than X"
    re.compile(rf"\b([\w+#.\-]+)\s+(?:\w+er|more\s+\w+|less\s+\w+|better|worse)\s+than\s+{_ARTICLES}([\w+#.\-]+)",
               re.IGNORECASE),
]
_CONVERT_FILLER = {"how", "way", "want", "need", "going", "able", "have", "like", "is", "it", "this", "way",
                   "code", "script", "program", "function", "possible", "ways", "back", "me", "them", "you",
                   "easiest", "best", "best", "quickest", "try", "tries", "trying"}


def _canon_word(w: str) -> str:
    low = w.lower().strip(".")
    low = _TECH_ALIASES.get(low, low)
    return {"integer": "int", "integers": "int", "ints": "int", "strings": "string", "str": "string",
            "dictionary": "dict", "dictionaries": "dict", "dicts": "dict", "lists": "list", "arrays": "array",
            "floats": "float", "tuples": "tuple", "sets": "set", "bytes": "bytes", "timestamps": "timestamp",
            "°c": "celsius", "°f": "fahrenheit", "kilometers": "km", "kilometres": "km", "miles": "mile",
            "pounds": "pound", "kilograms": "kg", "kilos": "kg", "inches": "inch", "centimeters": "cm",
            "centimetres": "cm", "meters": "meter", "metres": "meter", "feet": "foot"}.get(low, low)


_NAME_RUN = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b")


def conversions(text: str) -> frozenset[tuple[str, str]]:
    """Ordered (source, target) pairs: "Celsius to Fahrenheit", "string from an int" = (int, string)."""
    pairs: set[tuple[str, str]] = set()
    text = _NAME_RUN.sub(lambda m: m.group(0).replace(" ", "_"), text)  # "New York" is one place
    for i, rx in enumerate(_CONVERT):
        for m in rx.finditer(text):
            a, b = _canon_word(m.group(1)), _canon_word(m.group(2))
            if i in (2, 3):  # "X from Y", "how many X in Y": Y is the source
                a, b = b, a
            if a != b and a not in _CONVERT_FILLER and b not in _CONVERT_FILLER and not a.isdigit():
                pairs.add((a, b))
    return frozenset(pairs)



# ---------------------------------------------------------------- one-slot substitutions

# A trap usually keeps the question's frame and swaps one content word ("length of a string" ->
# "length of an array", "green tea" -> "black tea"); a paraphrase rewords the frame. So when the two
# prompts' content words align mostly one to one and a content word was replaced by an unrelated
# one, they ask different things. Synonyms map to one word first so "delete"/"remove" still agree.
_STOP = set(
    """
    a an the of in on at to for from with by into onto about as and or but if so than then that this these those
    is are was were be been being am do does did done doing have has had having can could should would will
    shall may might must i me my we our you your it its they them their he she his her there here what whats
    what's which who whom whose when where why how hows how's way ways best good right proper correct simple
    simplest easy easiest quick quickest common standard recommended ideal please tell explain show give me
    let lets let's want wanna need needs like would i'd i'm is there any some anyone someone possible able
    command commands method methods approach technique syntax code snippet example examples formula go
    use used using uses via python's just also really actually exactly one's own get got
    """.split()
)
_SYNONYMS: dict[str, str] = {}
for _canon_w, _alts in {
    "remove": "delete erase drop strip discard eliminate rid", "merge": "combine", "dict": "dictionary dictionaries dicts",
    "get": "fetch obtain retrieve find access grab determine", "make": "create build generate produce",
    "read": "load", "start": "begin launch beginning", "change": "modify update edit alter convert turn transform",
    "print": "display output", "error": "exception", "calculate": "compute", "element": "item entry",
    "directory": "folder", "image": "picture photo", "buy": "purchase", "big": "large", "small": "little",
    "fast": "quick speedy", "check": "test verify tell determine", "stop": "halt", "kill": "terminate",
    "list": "lists", "string": "str strings", "integer": "int integers ints", "number": "numbers",
    "function": "func", "many": "much", "loop": "iterate iterating loop", "length": "size len",
    "happen": "occur", "times": "multiplied multiply multiplying", "answer": "reply", "people": "person persons", "money": "cash", "car": "automobile",
}.items():
    for _a in _alts.split():
        _SYNONYMS[_a] = _canon_w


def _stem(w: str) -> str:
    w = _SYNONYMS.get(w, w)
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 5 and w.endswith("ing"):
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2]:
            w = w[:-1]
    elif len(w) > 4 and w.endswith("ed"):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    w = _SYNONYMS.get(w, w)
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def _raw_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9][a-z0-9+#']*", text.lower().replace("’", "'"))


def _tokens(text: str) -> list[str]:
    words = _raw_words(text)
    return [str(_UNITS[w]) if w in _UNITS else _stem(w.removesuffix("'s")) for w in words]


def _verb_slot(tokens: list[str], i: int) -> bool:
    return i == 0 or tokens[i - 1] in ("i", "you", "we", "to", "please")


def substitution(a: str, b: str) -> tuple[str, str] | None:
    """The (a-words, b-words) of a one-slot swap in an otherwise identical prompt, or None.

    Only a minimal edit counts: everything but one run of at most two words (besides function
    words) must be the same, in order. Paraphrases reword the frame and pass; a synonym swap
    (delete/remove) is normalised first.
    """
    ta, tb = _tokens(a), _tokens(b)
    ra, rb = _raw_words(a), _raw_words(b)
    swaps = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        left = [t for t, r in zip(ta[i1:i2], ra[i1:i2], strict=True) if r not in _STOP]
        right = [t for t, r in zip(tb[j1:j2], rb[j1:j2], strict=True) if r not in _STOP]
        if not left and not right:
            continue  # "a" -> "an", "do" -> "can": function words only
        if tag != "replace" or not left or not right or len(left) > 2 or len(right) > 2:
            return None
        known = any(w in _ACTIONS for w in ra[i1:i2] + rb[j1:j2])  # two different operations: not a paraphrase
        if _verb_slot(ta, i1) and _verb_slot(tb, j1) and not known:
            continue  # "How do I make/prepare ...": paraphrases swap the leading verb freely
        swaps.append((" ".join(left), " ".join(right)))
    if len(swaps) != 1 or len(ta) < 3:
        return None
    return swaps[0]


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Facts:
    numbers: tuple[str, ...]
    quoted: frozenset[str]
    identifiers: frozenset[str]
    negated: bool
    entities: frozenset[str]
    technologies: frozenset[str]
    directions: frozenset[tuple[str, str]]
    actions: frozenset[str]
    conversions: frozenset[tuple[str, str]] = field(default_factory=frozenset)


@lru_cache(maxsize=4096)
def facts(text: str) -> Facts:
    return Facts(
        numbers=numbers(text), quoted=quoted(text), identifiers=identifiers(text), negated=negated(text),
        entities=entities(text), technologies=technologies(text), directions=directions(text),
        actions=actions(text), conversions=conversions(text),
    )


def _entity_words(text: str) -> set[str]:
    return {w.lower().removesuffix("'s") for w in re.findall(r"[A-Za-z][A-Za-z0-9'\-]*", text)}


def compare(a: str, b: str) -> str | None:
    """None when `a`'s answer may serve `b`; otherwise the name of the first disagreement."""
    fa, fb = facts(a), facts(b)
    if fa.numbers != fb.numbers:
        return "numbers"
    if fa.quoted != fb.quoted:
        return "quoted"
    if fa.identifiers != fb.identifiers:
        return "identifiers"
    if fa.negated != fb.negated:
        return "negation"
    if fa.technologies != fb.technologies:
        return "technology"
    # An entity capitalised in one prompt may be lower-case in the other ("Paris"/"paris").
    if not fa.entities <= _entity_words(b) or not fb.entities <= _entity_words(a):
        return "entities"
    if fa.directions != fb.directions:
        return "direction"
    for x in fa.actions ^ fb.actions:
        if any(frozenset((x, y)) in _OPPOSITE_ACTIONS for y in fa.actions | fb.actions):
            return "direction"
    if any((y, x) in fb.conversions for (x, y) in fa.conversions):
        return "conversion"
    if substitution(a, b) is not None:
        return "substitution"
    return None


def agrees(a: str, b: str) -> bool:
    return compare(a, b) is None
