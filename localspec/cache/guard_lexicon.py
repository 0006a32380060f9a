"""The false-hit guard's word tables (localspec.cache.guard): numbers, directions, actions,
qualifiers, technologies and their aliases, names that are not entities, relation words.

Data, kept apart from the rules that read it, so each can be read (and reviewed) on its own.
"""

from __future__ import annotations

import re

from localspec.cache.normalize import canonical

UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "dozen": 12,
}

TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}

SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}

ORDINALS = {
    "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9,
    "tenth": 10, "hundredth": 100, "thousandth": 1000,
}

MULTIPLES = {"twice": 2, "triple": 3, "half": 0.5, "quarter": 0.25}

NOT_COUNTING = {"which", "this", "that", "the", "each", "any", "every", "no", "some", "another", "one", "a", "only"}

# CamelCase words that are names rather than identifiers.
BRANDS = {"dataframe", "iphone", "ipad", "youtube", "github", "gitlab", "linkedin", "powershell", "macos",
           "javascript", "typescript", "postgresql", "mongodb", "pytorch", "numpy", "fastapi", "openai", "chatgpt",
           "mysql", "graphql", "jquery", "webassembly", "wordpress", "paypal", "playstation", "mcdonald",
           "mcdonald's", "ebay", "whatsapp", "tiktok", "bigquery", "dynamodb", "nodejs", "nextjs", "vscode"}

NEGATION = re.compile(
    r"\b(?:not|no|never|without|none|nothing|nobody|nowhere|neither|nor|cannot|except(?! (?:clause|block|statement|keyword|handler))|excluding|exclude|"
    r"excludes|excluded|avoid|avoiding|prevent|preventing|ignore|ignoring|ignored|skip|skipping|unless|"
    r"lack|lacking|omit|omitting|isn't|aren't|wasn't|weren't|don't|doesn't|didn't|can't|won't|shouldn't|"
    r"wouldn't|couldn't|mustn't|haven't|hasn't|hadn't|non|un-|aside from|other than|instead of|rather than)\b",
    re.IGNORECASE,
)

# Each group lists its poles; a prompt's poles per group must match the other's exactly.
ITEMS = r"(?= (?:numbers?|integers?|ints?|indices|indexes|index|positions?|rows?|length|digits?|values?|elements?|entries|lines|items?))"

DIRECTIONS: dict[str, dict[str, str]] = {
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
        "last": r"last|ending|ends? with|ending with|suffix|trailing|tail|latest|final|most recent",
    },
    "letters": {"upper": r"upper ?case|uppercase|capitali[sz]e|capital letters|all caps",
             "lower": r"lower ?case|lowercase|small letters"},
    "side": {"left": r"left|lstrip|ljust", "right": r"right(?:-| )?(?:side|join|align(?:ed)?|shift|pad|most)|"
             r"to the right|rstrip|rjust"},
    "rounding": {"up": r"round(?:ing|ed)? up|ceil|ceiling", "down": r"round(?:ing|ed)? down|floor"},
    "parity": {"even": rf"even{ITEMS}|is even|evens", "odd": rf"odd{ITEMS}|is odd|odds"},
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
    "polarity": {"good": r"good for|healthy|beneficial|benefits?|advantages?|pros|safe|safely|safer|helpful",
                 "bad": r"bad for|unhealthy|harmful|risks?|disadvantages?|cons|dangerous|unsafe|harmful|drawbacks?"},
    "hardness": {"soft": r"soft|softer|runny", "hard": r"hard-boiled|hard|harder|firm"},
    "heat": {"hot": r"hot|hotter|warm|warmer|heat", "cold": r"cold|colder|cool|cooler|chill(?:ed)?"},
    "brightness": {"light": r"light mode|light theme|bright", "dark": r"dark mode|dark theme|dark"},
    "client": {"client": r"client(?:-side)?", "server": r"server(?:-side)?"},
    "frontback": {"frontend": r"front-?end", "backend": r"back-?end"},
}

# Groups where only two different poles conflict: a pole named on one side only is a qualifier the
# answer covers ("push to the remote" / "push local changes to the remote", "order the rows").
PAIRED_ONLY = {"axis", "inout", "global", "polarity", "brightness", "client", "frontback"}

# Verb pairs whose two sides are opposite actions: the "change" group above is a single bag of verbs,
# so instead each verb maps to a canonical action and the actions must agree.
ACTIONS: dict[str, str] = {}

for _pole, _words in {
    "add": "add adding adds added insert inserting inserts append appending appends push pushing include including",
    "remove": "remove removing removes removed clean cleaning delete deleting deletes deleted drop dropping pop popping "
              "strip stripping erase erasing discard discarding",
    "increase": "increase increasing increases increment incrementing raise raising grow growing enlarge expand "
                "expanding upscale improve improving boost boosting",
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
    "start": "start starting starts started launch launching begin began begins", "stop": "stop stopping stops kill killing terminate halt",
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
    "create": "create creating creates created generate generating build building",
    "query": "find finding finds search searching locate count counting check checking select selecting "
             "lookup detect identify",
    "end": "end ends ended finish finishes finished",
    "win": "win winning won", "lose": "lose losing lost",
}.items():
    for _w in _words.split():
        ACTIONS[_w] = _pole

# Actions that are each other's opposite; only these can conflict.
OPPOSITE_ACTIONS = {
    frozenset(p) for p in [
        ("add", "remove"), ("increase", "decrease"), ("install", "uninstall"), ("enable", "disable"),
        ("show", "hide"), ("lock", "unlock"), ("join", "split"), ("mount", "unmount"), ("open", "close"),
        ("start", "stop"), ("subscribe", "unsubscribe"), ("encrypt", "decrypt"), ("encode", "decode"),
        ("compress", "decompress"), ("serialize", "deserialize"), ("upload", "download"),
        ("import", "export"), ("read", "write"), ("send", "receive"), ("push", "pull"),
        ("connect", "disconnect"), ("freeze", "unfreeze"), ("wrap", "unwrap"), ("escape", "unescape"), ("set", "unset"),
        ("buy", "sell"), ("win", "lose"), ("create", "remove"), ("query", "remove"), ("query", "create"),
        ("query", "add"), ("start", "end"),
    ]
}

# Actions that change their object; named on one side only, the prompts ask for different things
# ("remove the first character" / "get the first character"). Creating, writing, sending and
# querying verbs are often implied ("a function that ..." / "write a function that ...").
CHANGING_ACTIONS = {"remove", "add", "install", "uninstall", "enable", "disable", "hide", "increase", "decrease",
                     "encrypt", "decrypt", "compress", "decompress", "upload", "download", "import", "export",
                     "lock", "unlock", "subscribe", "unsubscribe", "mount", "unmount", "buy", "sell", "connect",
                     "disconnect", "freeze", "unfreeze"}

# Modifiers that make the noun another thing or ask for another method: a linked list is not a
# list, a deep copy not a copy. One present on one side only changes the answer.
QUALIFIERS = {canonical(w): w for w in """
    linked doubly singly circular hidden binary abstract static private public protected
    anonymous recursive recursively iterative iteratively inplace immutable mutable weighted directed
    undirected sparse dense multidimensional 2d 3d unique distinct deep shallow parallel concurrent
    concurrently lazy lazily stable insensitive insensitively sensitive
    """.split()}

TECH_ALIASES: dict[str, str] = {}

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
    "react": "react reactjs react.js", "vue": "vue vuejs vue.js", "angular": "angular", "svelte": "svelte", "jquery": "jquery",
    "django": "django", "flask": "flask", "fastapi": "fastapi", "express": "expressjs express.js", "spring": "",
    "rails": "rails", "laravel": "laravel", "node": "node nodejs node.js", "deno": "deno", "bun": "",
    "docker": "docker dockerfile", "kubernetes": "kubernetes k8s kubectl", "git": "git github gitlab",
    "linux": "linux ubuntu debian", "windows": "windows", "macos": "macos osx mac", "android": "android",
    "ios": "ios", "aws": "aws s3 ec2 lambda", "gcp": "gcp", "azure": "azure", "terraform": "terraform",
    "ansible": "ansible", "nginx": "nginx", "apache": "apache", "excel": "excel", "vim": "vim neovim",
    "emacs": "emacs", "vscode": "vscode", "npm": "npm", "pip": "pip", "conda": "conda", "cargo": "cargo",
    "maven": "maven", "gradle": "gradle", "gpu": "gpu cuda", "cpu": "cpu", "tpu": "tpu", "requests": "", "asyncio": "asyncio", "regex": "",
    "json": "json", "yaml": "yaml yml", "xml": "xml", "csv": "csv", "toml": "toml", "protobuf": "protobuf",
    "graphql": "graphql", "rest": "", "grpc": "grpc", "kafka": "kafka", "rabbitmq": "rabbitmq", "spark": "spark pyspark",
    "hadoop": "hadoop", "airflow": "airflow", "selenium": "selenium", "pytest": "pytest", "unittest": "unittest",
    "jest": "jest", "junit": "junit", "tailwind": "tailwind", "bootstrap": "bootstrap", "nextjs": "nextjs next.js",
    "opencv": "opencv cv2", "pillow": "pillow pil", "beautifulsoup": "beautifulsoup bs4", "sqlalchemy": "sqlalchemy",
    "celery": "celery", "httpx": "httpx", "aiohttp": "aiohttp", "urllib": "urllib urllib3",
    "axios": "axios", "lodash": "lodash", "pydantic": "pydantic", "boto3": "boto3", "podman": "podman", "latex": "latex", "markdown": "markdown", "unity": "", "unreal": "unreal",
}.items():
    for _a in (_aliases.split() or []):
        TECH_ALIASES[_a] = _canon
    if _aliases and _canon not in ("go", "swift", "spring", "express", "bun", "requests", "rest", "unity", "c", "r"):
        TECH_ALIASES.setdefault(_canon, _canon)

# English words that name a technology only when written with a capital (or unambiguously).
TECH_CAPITAL_ONLY = {"C": "c", "R": "r", "Go": "go", "Swift": "swift", "Spring": "spring", "Express": "express",
                      "Bun": "bun", "Requests": "requests", "REST": "rest", "Unity": "unity", "Rust": "rust",
                      "Ruby": "ruby", "Julia": "julia", "Dart": "dart", "Node": "node", "Flask": "flask"}

# A library or tool implies its language: "install a package with pip" asks about Python.
IMPLIES: dict[str, str] = {}

for _lang, _tools in {
    "python": "pandas numpy polars scipy matplotlib seaborn plotly sklearn pytorch tensorflow keras jax "
              "transformers django flask fastapi pip conda asyncio pytest unittest opencv pillow beautifulsoup "
              "sqlalchemy celery httpx aiohttp urllib pydantic boto3 requests",
    "javascript": "react vue angular svelte jquery express node deno bun npm jest nextjs axios lodash",
    "java": "spring maven junit", "rust": "cargo", "ruby": "rails", "php": "laravel",
}.items():
    for _t in _tools.split():
        IMPLIES[_t] = _lang

# Common abbreviations of names, expanded (case-sensitively) before any fact is read.
ABBREVIATIONS = [(re.compile(p), r) for p, r in [
    (r"\bWW(?:II|2)\b", "World War II"), (r"\bWW(?:I|1)\b", "World War I"),
    (r"\b(?:USA|U\.S\.A\.|U\.S\.|US)(?![\w.])", "United States"), (r"\b(?:UK|U\.K\.)(?![\w.])", "United Kingdom"),
    (r"\bmore than one\b", "multiple"),
    (r"\bNYC\b", "New York City"), (r"\bEU\b", "European Union"), (r"\bUN\b", "United Nations"),
    (r"\bUAE\b", "United Arab Emirates"), (r"\b(?:on|of) (?:the )?[Ee]arth\b", "in the world"),
]]

# Capitalised words that start questions or are common enough not to name anything.
NOT_ENTITIES = set(
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

ARTICLES = r"(?:(?:a|an|the|my|some|this|that|these|those|its|their|your)\s+)?"

CONVERT = [
    re.compile(rf"\bfrom\s+{ARTICLES}([\w+#.\-]+)\s+(?:to|into|in)\s+{ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(rf"\b([\w+#.\-]+)\s+(?:to|into|->|→)\s+{ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(rf"\b([\w+#.\-]+)\s+from\s+{ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
    re.compile(rf"\bhow many\s+([\w+#.\-]+)\s+(?:(?:are|is)\s+)?(?:there\s+)?in\s+(?:[\d.,]+\s+)?{ARTICLES}([\w+#.\-]+)",
               re.IGNORECASE),
    # comparisons are ordered too: "X faster than Y" is not "Y faster than X"
    re.compile(rf"\b([\w+#.\-]+)\s+(?:\w+er|more\s+\w+|less\s+\w+|better|worse)\s+than\s+{ARTICLES}([\w+#.\-]+)",
               re.IGNORECASE),
    # "replace X with Y" is not "replace Y with X"
    re.compile(rf"\b(?:replac|substitut|swap)\w*\s+(?:all\s+|every\s+|each\s+)?{ARTICLES}([\w+#.\-]+)\s+"
               rf"(?:with|by|for)\s+{ARTICLES}([\w+#.\-]+)", re.IGNORECASE),
]

CONVERT_FILLER = {"how", "way", "want", "need", "going", "able", "have", "like", "is", "it", "this", "code", "script", "program", "function", "possible", "ways", "back", "me", "them", "you",
                   "easiest", "best", "quickest", "try", "tries", "trying"}

UNIT_WORDS = {"kilometer": "km", "kilometre": "km", "kilogram": "kg", "kilo": "kg", "centimeter": "cm",
               "centimetre": "cm", "metre": "meter", "feet": "foot", "°c": "celsius", "°f": "fahrenheit"}

# A relation word keeps its meaning when its two ends trade places only in a paraphrase that also
# changes the word ("X to Y" = "Y from X"); with the same word in both prompts, swapped ends ask
# the opposite question: "144 divided by 12" / "12 divided by 144", "copy from the container to my
# host" / "from my host into the container", "JSON into a struct" / "a struct to JSON". Words
# of one group count as the same relation word.
RELATION_WORDS = {"to": "to", "into": "to", "onto": "to", "from": "from", "of": "of", "in": "in", "by": "by",
                   "than": "than", "per": "per"}
