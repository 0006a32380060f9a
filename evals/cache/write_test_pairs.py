"""Writes pairs_test.jsonl: the test half `localspec cache eval` reports (the default split).

Written blind: its author saw neither the guard's rules nor the dev pairs. Every group is
hand-written: a base question, 2-4 paraphrases (same answer) and 2-4 traps (look similar, but the
cached answer would be wrong or incomplete). The script expands the groups into (a, b) pairs,
validates them, and drops every pair with a text that also occurs in the dev pairs (dev and
dev_blind), so no tuned-on question is scored again. Never tune on this file.

Run from the repo root: python evals/cache/write_test_pairs.py
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pairs_test.jsonl")
DEV = [os.path.join(HERE, "pairs_dev.jsonl"), os.path.join(HERE, "pairs_dev_blind.jsonl")]

CAT = {
    "N": "negation",
    "U": "number",
    "E": "entity",
    "L": "language",
    "B": "library",
    "D": "direction",
    "O": "other",
}

GROUPS = []


def g(domain, base, paras, traps):
    GROUPS.append({"domain": domain, "base": base, "paras": paras, "traps": traps})


def code(base, paras, traps):
    g("code", base, paras, traps)


def gen(base, paras, traps):
    g("general", base, paras, traps)


# ---------------------------------------------------------------------------
# CODE / DEV
# ---------------------------------------------------------------------------
code("How do I reverse a list in Python?",
     ["python reverse list",
      "What's the easiest way to reverse the order of items in a Python list?",
      "how to reverse a list in pyhton"],
     [("L", "How do I reverse an array in JavaScript?"),
      ("N", "How do I reverse a list in Python without using reverse() or slicing?"),
      ("O", "How do I sort a list in Python?")])

code("How do I read a JSON file in Python?",
     ["python load json from file",
      "What's the way to parse a .json file into a dict in Python?",
      "reading a json file with python"],
     [("D", "How do I write a dict to a JSON file in Python?"),
      ("E", "How do I read a YAML file in Python?"),
      ("L", "How do I read a JSON file in Go?"),
      ("B", "How do I read a JSON file into a pandas DataFrame?")])

code("How can I remove duplicates from an array in JavaScript?",
     ["js dedupe array",
      "javascript: get unique values from an array",
      "What's the best way to filter out duplicate elements of a JS array?"],
     [("O", "How can I count the duplicates in an array in JavaScript?"),
      ("L", "How can I remove duplicates from a list in Python?"),
      ("N", "How can I keep only the values that are not repeated in a JavaScript array?"),
      ("B", "How can I remove duplicates from an array using lodash?")])

code("How do I undo the last git commit but keep my changes?",
     ["git undo last commit keep changes",
      "How can I uncommit the latest commit in git while keeping the changes in my working tree?",
      "git: undo previous commit but keep the modified files"],
     [("N", "How do I undo the last git commit without keeping the changes?"),
      ("U", "How do I undo the last 3 git commits but keep my changes?"),
      ("O", "How do I change the message of the last git commit?")])

code("How do I list running Docker containers?",
     ["docker show running containers",
      "command to see which docker containers are currently running",
      "list active containers docker"],
     [("N", "How do I list Docker containers that are not running?"),
      ("E", "How do I list Docker images?"),
      ("B", "How do I list running pods in Kubernetes?")])

code("SQL query to get the 5 highest paid employees",
     ["sql top 5 employees by salary",
      "How do I write a SQL query that returns the five employees with the highest salaries?",
      "select the 5 employees with biggest salary in sql"],
     [("U", "SQL query to get the 10 highest paid employees"),
      ("D", "SQL query to get the 5 lowest paid employees"),
      ("N", "SQL query to get all employees except the 5 highest paid"),
      ("B", "How do I get the 5 highest paid employees from a pandas DataFrame?")])

code("How do I convert a string like '2024-03-15' to a datetime in Python?",
     ["python parse date string '2024-03-15' to datetime",
      "convert '2024-03-15' string into datetime object python",
      "What's the way to turn the string '2024-03-15' into a Python datetime?"],
     [("D", "How do I convert a datetime to a string like '2024-03-15' in Python?"),
      ("L", "How do I convert a string like '2024-03-15' to a Date in JavaScript?"),
      ("B", "How do I convert a column of strings like '2024-03-15' to datetime with pandas?")])

code("How do I count the number of lines in a file in bash?",
     ["bash count lines in file",
      "linux command to get the line count of a file",
      "how can i see how many lines a text file has from the terminal"],
     [("O", "How do I count the number of words in a file in bash?"),
      ("N", "How do I count the lines in a file that do not contain 'ERROR' in bash?"),
      ("L", "How do I count the number of lines in a file in PowerShell?"),
      ("B", "How do I count the number of lines in a file using awk?")])

code("How do I center a div horizontally and vertically with flexbox?",
     ["css flexbox center div both axes",
      "center an element horizontally and vertically using flex",
      "how to use flexbox to put a div in the middle, both horizontally and vertically"],
     [("B", "How do I center a div horizontally and vertically with Tailwind CSS?"),
      ("O", "How do I center a div only horizontally with flexbox?"),
      ("N", "How do I center a div vertically without using flexbox?")])

code("How do I sort a Python dictionary by value?",
     ["python sort dict by values",
      "sorting a dictonary by its values in python",
      "What's the way to order a dict by value in Python?"],
     [("D", "How do I sort a Python dictionary by value in descending order?"),
      ("O", "How do I sort a Python dictionary by key?"),
      ("L", "How do I sort a HashMap by value in Java?")])

code("How do I send a POST request with a JSON body using fetch in JavaScript?",
     ["fetch post json body js",
      "javascript fetch: how to POST JSON data",
      "How can I make a POST request with a JSON payload using the fetch API?"],
     [("B", "How do I send a POST request with a JSON body using axios?"),
      ("E", "How do I send a PUT request with a JSON body using fetch in JavaScript?"),
      ("O", "How do I send a POST request with form data using fetch in JavaScript?")])

code("How do I read an entire file into a string in Go?",
     ["golang read whole file to string",
      "go: load a file's contents into a string",
      "what's the way to read all of a file as a string in golang"],
     [("L", "How do I read an entire file into a string in Rust?"),
      ("O", "How do I read a file line by line in Go?"),
      ("D", "How do I write a string to a file in Go?")])

code("How do I convert a String to an i32 in Rust?",
     ["rust parse string to i32",
      "Rust: turn a String into an i32",
      "how to parse a string as an i32 in rust"],
     [("D", "How do I convert an i32 to a String in Rust?"),
      ("E", "How do I convert a String to an f64 in Rust?"),
      ("L", "How do I convert a string to an int in Go?")])

code("How do I check if a string is empty in Java?",
     ["java check empty string",
      "Java: test whether a String is empty",
      "whats the way to see if a string has no characters in java"],
     [("N", "How do I check if a string is not empty in Java?"),
      ("L", "How do I check if a string is empty in C#?"),
      ("O", "How do I check if a string is null or whitespace in Java?"),
      ("B", "How do I check if a string is empty using Apache Commons StringUtils?")])

code("How do I join a List<string> into a comma-separated string in C#?",
     ["c# join list of strings with comma",
      "C#: convert List<string> to a comma separated string",
      "How can I concatenate a list of strings separated by commas in C#?"],
     [("D", "How do I split a comma-separated string into a List<string> in C#?"),
      ("L", "How do I join a list of strings with commas in Python?"),
      ("E", "How do I join a List<string> into a newline-separated string in C#?")])

code("How do I view the logs of a pod in Kubernetes?",
     ["kubectl see pod logs",
      "kuberentes show logs for a pod",
      "command to check a pod's logs in k8s"],
     [("O", "How do I view the logs of the previous crashed container of a pod in Kubernetes?"),
      ("B", "How do I view the logs of a Docker container?"),
      ("U", "How do I view only the last 100 lines of a pod's logs in Kubernetes?")])

code("Regex to validate an email address",
     ["regular expression for email validation",
      "what regex should I use to check if a string is an email",
      "email address regex pattern"],
     [("E", "Regex to validate a US phone number"),
      ("E", "Regex to validate an IPv4 address"),
      ("O", "Regex to extract the domain from an email address")])

code("How do I create a virtual environment in Python?",
     ["python create venv",
      "how to make a python virtualenv",
      "set up a virtual environment for a python project"],
     [("B", "How do I create a virtual environment with conda?"),
      ("O", "How do I activate a Python virtual environment on Windows?"),
      ("D", "How do I delete a Python virtual environment?")])

code("How do I create a new branch in git and switch to it?",
     ["git create and checkout new branch",
      "git command to make a new branch and switch to it",
      "how to create a branch and move to it in git at once"],
     [("D", "How do I delete a branch in git?"),
      ("O", "How do I rename a branch in git?"),
      ("E", "How do I create a new tag in git?"),
      ("B", "How do I create a new branch in Mercurial and switch to it?")])

code("How do I remove a key from a dictionary in Python?",
     ["python delete key from dict",
      "remove an entry from a python dictionary by key",
      "how can i drop a key from a dict in python"],
     [("D", "How do I add a key to a dictionary in Python?"),
      ("L", "How do I remove a key from an object in JavaScript?"),
      ("N", "How do I remove all keys from a dictionary except one in Python?")])

code("How do I read a CSV file into a pandas DataFrame?",
     ["pandas load csv",
      "read csv to dataframe pandas",
      "What's the way to import a CSV file as a DataFrame with pandas?"],
     [("E", "How do I read an Excel file into a pandas DataFrame?"),
      ("B", "How do I read a CSV file into a Polars DataFrame?"),
      ("D", "How do I save a pandas DataFrame to a CSV file?"),
      ("N", "How do I read a CSV file into pandas when the file has no header row?")])

code("How do I drop rows with missing values in a pandas DataFrame?",
     ["pandas remove rows with NaN",
      "drop NaN rows dataframe",
      "How can I delete all rows that contain null values in pandas?"],
     [("O", "How do I fill missing values with 0 in a pandas DataFrame?"),
      ("E", "How do I drop columns with missing values in a pandas DataFrame?"),
      ("L", "How do I drop rows with missing values in an R data frame?"),
      ("B", "How do I drop rows with missing values in a Polars DataFrame?")])

code("SQL: count the number of orders per customer",
     ["sql count orders for each customer",
      "How do I get the number of orders each customer has in SQL?",
      "sql query orders count grouped by customer"],
     [("O", "SQL: sum the order totals per customer"),
      ("N", "SQL: find customers without any orders"),
      ("U", "SQL: find customers with more than 5 orders"),
      ("B", "How do I count the number of orders per customer in a pandas DataFrame?")])

code("How do I sort an array of numbers in ascending order in JavaScript?",
     ["js sort numbers ascending",
      "javscript sort number array smallest to largest",
      "How can I sort a numeric array ascending in JS?"],
     [("D", "How do I sort an array of numbers in descending order in JavaScript?"),
      ("E", "How do I sort an array of strings alphabetically in JavaScript?"),
      ("L", "How do I sort an array of numbers in ascending order in PHP?"),
      ("B", "How do I sort an array of numbers in ascending order with lodash?")])

code("How do I check if a file exists in Python?",
     ["python check file exists",
      "test whether a file exists with python",
      "How can I see if a file is present at a given path in Python?"],
     [("E", "How do I check if a directory exists in Python?"),
      ("L", "How do I check if a file exists in bash?"),
      ("N", "How do I create a file in Python only if it does not already exist?")])

code("How do I remove all stopped Docker containers?",
     ["docker delete stopped containers",
      "clean up all exited containers in docker",
      "command to remove every stopped docker container"],
     [("E", "How do I remove all unused Docker images?"),
      ("O", "How do I stop all running Docker containers?"),
      ("N", "How do I remove all Docker containers except one?"),
      ("B", "How do I remove all stopped containers with Podman?")])

code("What does HTTP status code 404 mean?",
     ["http 404 meaning",
      "what is a 404 error",
      "What is the meaning of the 404 status code in HTTP?"],
     [("U", "What does HTTP status code 403 mean?"),
      ("U", "What does HTTP status code 502 mean?"),
      ("O", "How do I return a 404 status code in Express?")])

code("How do I make a property optional in a TypeScript interface?",
     ["typescript interface optional property",
      "ts: mark a field as optional in an interface",
      "how to declare an optional member of a typescript interface"],
     [("O", "How do I make a property readonly in a TypeScript interface?"),
      ("D", "How do I make all optional properties required in a TypeScript type?"),
      ("L", "How do I make a field optional in a Python dataclass?"),
      ("B", "How do I make a field optional in a Zod schema?")])

code("Python list comprehension to get the even numbers from a list",
     ["python comprehension filter even numbers",
      "how to keep only even numbers in a list using a list comprehension in python",
      "list comprehension even values python"],
     [("N", "Python list comprehension to get the numbers from a list that are not even"),
      ("U", "Python list comprehension to get the numbers divisible by 3 from a list"),
      ("L", "JavaScript filter to get the even numbers from an array")])

code("How do I squash the last 3 commits in git?",
     ["git squash last three commits",
      "combine my last 3 git commits into one",
      "how to merge the previous 3 commits into a single commit in git"],
     [("U", "How do I squash the last 5 commits in git?"),
      ("O", "How do I reorder the last 3 commits in git?"),
      ("D", "How do I split a commit into multiple commits in git?")])

code("How do I convert a string to uppercase in Python?",
     ["python uppercase string",
      "make a string all caps in python",
      "python: turn a string into upper case"],
     [("D", "How do I convert a string to lowercase in Python?"),
      ("L", "How do I convert a string to uppercase in Java?"),
      ("O", "How do I capitalize only the first letter of a string in Python?")])

code("What's the difference between INNER JOIN and LEFT JOIN in SQL?",
     ["inner join vs left join sql",
      "sql: how does LEFT JOIN differ from INNER JOIN",
      "explain the difference between left join and inner join in sql"],
     [("E", "What's the difference between LEFT JOIN and FULL OUTER JOIN in SQL?"),
      ("O", "What's the difference between UNION and UNION ALL in SQL?")])

code("How do I make a GET request with the requests library in Python?",
     ["python requests get example",
      "how to send an http GET using python requests",
      "requests library: perform a GET request"],
     [("B", "How do I make a GET request with httpx in Python?"),
      ("N", "How do I make a GET request with requests without verifying the SSL certificate?"),
      ("E", "How do I make a POST request with the requests library in Python?")])

code("How do I read an environment variable in Node.js?",
     ["node js get env variable",
      "access environment variables in nodejs",
      "how can a node app read an env var"],
     [("D", "How do I set an environment variable in Node.js?"),
      ("L", "How do I read an environment variable in Python?"),
      ("B", "How do I read an environment variable in Deno?")])

code("How do I convert an ArrayList to an array in Java?",
     ["java arraylist to array",
      "convert an ArrayList into an array java",
      "Java: turn an ArrayList into a plain array"],
     [("D", "How do I convert an array to an ArrayList in Java?"),
      ("L", "How do I convert a List to an array in C#?"),
      ("E", "How do I convert an ArrayList to a Set in Java?")])

code("How do I find files larger than 100MB in Linux?",
     ["linux find files bigger than 100mb",
      "find command files over 100 MB",
      "How can I list all files above 100MB on linux?"],
     [("U", "How do I find files larger than 1GB in Linux?"),
      ("D", "How do I find files smaller than 100MB in Linux?"),
      ("O", "How do I find files modified in the last 7 days in Linux?"),
      ("N", "How do I find files larger than 100MB in Linux, excluding the /proc directory?")])

code("How do I merge two dictionaries in Python?",
     ["python merge dicts",
      "combine two dicts into one python",
      "whats the way to merge 2 dictionaries in python"],
     [("L", "How do I merge two objects in JavaScript?"),
      ("O", "How do I find the common keys of two dictionaries in Python?"),
      ("U", "How do I merge a list of 10 dictionaries into one in Python?"),
      ("N", "How do I merge two dictionaries in Python without overwriting existing keys?")])

code("How do I run a useEffect only once on mount in React?",
     ["react useEffect run only once",
      "useEffect on mount only",
      "How can I make useEffect execute just once when the component mounts?"],
     [("D", "How do I run code when a React component unmounts?"),
      ("B", "How do I run code only once on mount in Vue?"),
      ("N", "How do I make useEffect not run on the first render?")])

code("How do I iterate over a HashMap in Rust?",
     ["rust loop over hashmap",
      "iterate through the key value pairs of a HashMap in rust",
      "rust hashmap iteration"],
     [("L", "How do I iterate over a HashMap in Java?"),
      ("E", "How do I iterate over a Vec in Rust?"),
      ("O", "How do I sort a HashMap by key in Rust?")])

code("How do I round a number to 2 decimal places in Python?",
     ["python round to two decimals",
      "round float 2 decimal places python",
      "How can I round a float to 2 digits after the decimal point in Python?"],
     [("U", "How do I round a number to 3 decimal places in Python?"),
      ("L", "How do I round a number to 2 decimal places in JavaScript?"),
      ("D", "How do I round a number down to 2 decimal places in Python?"),
      ("B", "How do I round a pandas DataFrame column to 2 decimal places?")])

code("How do I discard local changes to a single file in git?",
     ["git discard changes in one file",
      "git throw away uncommitted changes to one file",
      "how to undo my unstaged edits to one file in git"],
     [("O", "How do I discard all local changes in git?"),
      ("N", "How do I discard all local changes in git except for one file?")])

code("How do I rebuild the images and start my containers with docker compose?",
     ["docker compose rebuild and up",
      "docker-compose up with rebuild",
      "how to force docker compose to rebuild images before starting the containers"],
     [("D", "How do I stop and remove my containers with docker compose?"),
      ("N", "How do I start my containers with docker compose without rebuilding the images?"),
      ("O", "How do I rebuild only one service with docker compose?")])

code("How do I get the current Unix timestamp in Python?",
     ["python current unix time",
      "get epoch time now python",
      "how to get the seconds since the epoch in python"],
     [("L", "How do I get the current Unix timestamp in Go?"),
      ("U", "How do I get the current Unix timestamp in milliseconds in Python?"),
      ("D", "How do I convert a Unix timestamp to a date in Python?")])

code("How do I debounce a function in JavaScript?",
     ["javascript debounce function",
      "implement debounce in js",
      "how can i write a debounce helper in JavaScript"],
     [("O", "How do I throttle a function in JavaScript?"),
      ("B", "How do I debounce a function with lodash?"),
      ("L", "How do I debounce a function in Python?")])

code("How do I delete duplicate rows in PostgreSQL but keep one?",
     ["postgres remove duplicate rows keep one",
      "postgresql delete duplicates leaving one copy",
      "how to dedupe a table in postgres keeping a single row"],
     [("B", "How do I delete duplicate rows in MySQL but keep one?"),
      ("O", "How do I find duplicate rows in PostgreSQL?"),
      ("N", "How do I delete duplicate rows in PostgreSQL without keeping any copies?")])

code("How do I write a list of strings to a text file, one per line, in Python?",
     ["python write list to file each item on new line",
      "save list of strings to txt file line by line python",
      "how to dump a list into a text file with one element per line using python"],
     [("D", "How do I read a text file into a list of lines in Python?"),
      ("E", "How do I write a list of strings to a CSV file in Python?"),
      ("L", "How do I write an array of strings to a text file, one per line, in Node.js?")])

code("How do I wait for all goroutines to finish in Go?",
     ["golang wait for goroutines",
      "go: wait until all goroutines complete",
      "how can main wait until every goroutine is done in go"],
     [("O", "How do I cancel a running goroutine in Go?"),
      ("U", "How do I limit Go to 10 goroutines running at once?"),
      ("L", "How do I wait for all threads to finish in Java?"),
      ("B", "How do I wait for all goroutines using errgroup in Go?")])

code("How do I format a number with commas as thousands separators in Python?",
     ["python format number with commas",
      "python thousands separator formatting",
      "how to print a number like 1234567 as 1,234,567 in python"],
     [("L", "How do I format a number with commas as thousands separators in JavaScript?"),
      ("O", "How do I format a number as a percentage in Python?"),
      ("E", "How do I format a number with periods as thousands separators in Python?")])

code("How do I change the remote URL of a git repository?",
     ["git change remote url",
      "update origin url git",
      "how to set a new url for the origin remote in git"],
     [("D", "How do I remove a remote from a git repository?"),
      ("O", "How do I see the remote URL of a git repository?"),
      ("E", "How do I change the URL of a git submodule?")])

code("How do I generate a random integer between 1 and 10 in Python?",
     ["python random number 1 to 10",
      "random int between 1 and 10 python",
      "how do you get a random whole number from 1-10 in python"],
     [("U", "How do I generate a random integer between 1 and 100 in Python?"),
      ("L", "How do I generate a random integer between 1 and 10 in JavaScript?"),
      ("N", "How do I generate a random integer between 1 and 10 in Python that is not 5?"),
      ("B", "How do I generate a random integer between 1 and 10 with NumPy?")])

code("How do I scale a Kubernetes deployment to 3 replicas?",
     ["kubectl scale deployment to 3 replicas",
      "k8s set deployment replicas to 3",
      "how to change a deployment's replica count to three in kubernetes"],
     [("U", "How do I scale a Kubernetes deployment to 0 replicas?"),
      ("O", "How do I autoscale a Kubernetes deployment based on CPU usage?"),
      ("E", "How do I scale a Kubernetes statefulset to 3 replicas?"),
      ("B", "How do I scale a service to 3 replicas with docker compose?")])

code("How do I catch multiple exceptions in one except block in Python?",
     ["python catch multiple exceptions single except",
      "handle several exception types in one except clause python",
      "python except two exceptions at once"],
     [("L", "How do I catch multiple exceptions in one catch block in Java?"),
      ("O", "How do I re-raise an exception in Python?"),
      ("N", "How do I catch all exceptions except KeyboardInterrupt in Python?")])

code("CSS media query for screens smaller than 768px",
     ["css media query for screen width below 768px",
      "media query for screens under 768 pixels wide",
      "how to write a css rule that only applies when the screen is narrower than 768px"],
     [("D", "CSS media query for screens larger than 768px"),
      ("U", "CSS media query for screens smaller than 480px"),
      ("E", "CSS media query for print"),
      ("B", "How do I apply styles only on screens smaller than 768px in Tailwind?")])

code("How do I loop over all .txt files in a directory in bash?",
     ["bash for loop over txt files",
      "iterate over every .txt file in a folder with bash",
      "bash script loop through *.txt files in a directory"],
     [("E", "How do I loop over all .csv files in a directory in bash?"),
      ("L", "How do I loop over all .txt files in a directory in PowerShell?"),
      ("N", "How do I loop over all files except .txt files in a directory in bash?")])

code("How do I get the sum of a list of numbers in Python?",
     ["python sum list",
      "add up all numbers in a python list",
      "total of a list of ints in python"],
     [("O", "How do I get the average of a list of numbers in Python?"),
      ("L", "How do I get the sum of an array of numbers in JavaScript?"),
      ("U", "How do I get the sum of the first 5 numbers of a list in Python?"),
      ("B", "How do I get the sum of a NumPy array?")])

code("How do I check if an object has a key in JavaScript?",
     ["js check if key exists in object",
      "javascript test if an object contains a property",
      "how to see whether a JS object has a certain key"],
     [("E", "How do I check if an array contains a value in JavaScript?"),
      ("L", "How do I check if a dict has a key in Python?"),
      ("N", "How do I check if an object has no keys in JavaScript?")])

code("How do I add a column to an existing table in PostgreSQL?",
     ["postgres add column to table",
      "alter table add new column postgresql",
      "postgresql: add a column to a table that already exists"],
     [("D", "How do I drop a column from a table in PostgreSQL?"),
      ("O", "How do I rename a column in PostgreSQL?"),
      ("B", "How do I add a new column to an existing pandas DataFrame?")])

code("What's the difference between @staticmethod and @classmethod in Python?",
     ["python staticmethod vs classmethod",
      "difference between classmethod and staticmethod in python",
      "when to use @classmethod versus @staticmethod in python"],
     [("E", "What's the difference between @property and @cached_property in Python?"),
      ("L", "What's the difference between static and instance methods in Java?"),
      ("O", "What's the difference between @staticmethod and a regular instance method in Python?")])

code("How do I create a 3x3 array of zeros in NumPy?",
     ["numpy 3x3 zeros",
      "make a 3 by 3 zero matrix with numpy",
      "numpy array of zeros with shape (3,3)"],
     [("U", "How do I create a 4x4 array of zeros in NumPy?"),
      ("E", "How do I create a 3x3 array of ones in NumPy?"),
      ("B", "How do I create a 3x3 tensor of zeros in PyTorch?")])

code("How do I show the git log with one line per commit?",
     ["git log oneline",
      "compact git log one commit per line",
      "show git history as one line per commit"],
     [("U", "How do I show only the last 5 commits in git log?"),
      ("O", "How do I show the git log for a single file?"),
      ("N", "How do I show the git log without merge commits?")])

code("How do I pause execution for 5 seconds in Python?",
     ["python sleep 5 seconds",
      "python wait 5 sec",
      "make a python script pause for five seconds"],
     [("U", "How do I pause execution for 500 milliseconds in Python?"),
      ("L", "How do I pause execution for 5 seconds in JavaScript?"),
      ("B", "How do I pause for 5 seconds inside an asyncio coroutine in Python?")])

code("How do I write a generic function in TypeScript?",
     ["typescript generic function example",
      "ts generics in functions",
      "how to define a function with a type parameter in typescript"],
     [("L", "How do I write a generic function in Rust?"),
      ("E", "How do I write a generic class in TypeScript?"),
      ("O", "How do I constrain a generic type parameter in TypeScript?")])

code("How do I pretty-print JSON in Python?",
     ["python pretty print json",
      "print json with indentation python",
      "format json nicely in python"],
     [("B", "How do I pretty-print JSON on the command line with jq?"),
      ("D", "How do I minify JSON in Python?"),
      ("L", "How do I pretty-print JSON in JavaScript?")])

code("Regex to match a string containing only digits",
     ["regex only numbers",
      "regular expression digits only",
      "regex that matches strings made of just digits"],
     [("N", "Regex to match a string that contains no digits"),
      ("U", "Regex to match exactly 5 digits"),
      ("E", "Regex to match a string containing only letters")])

code("How do I get the current date in MySQL?",
     ["mysql current date",
      "mysql today's date function",
      "what function returns today's date in mysql"],
     [("B", "How do I get the current date in SQL Server?"),
      ("O", "How do I get the current date and time in MySQL?"),
      ("U", "How do I get the date 7 days ago in MySQL?")])

code("How do I loop over a list with the index in Python?",
     ["python for loop with index",
      "iterate list with index and value python",
      "python get the index while looping through a list"],
     [("L", "How do I loop over a slice with the index in Go?"),
      ("D", "How do I loop over a list backwards in Python?"),
      ("U", "How do I loop over a list starting at index 1 in Python?")])

code("How do I kill the process listening on port 3000?",
     ["kill process on port 3000",
      "free up port 3000 by killing whatever is using it",
      "how to stop the process that's using port 3000 on linux"],
     [("U", "How do I kill the process listening on port 8080?"),
      ("O", "How do I find which process is listening on port 3000 without killing it?"),
      ("L", "How do I kill the process listening on port 3000 in Windows PowerShell?")])

code("How do I convert a Python list to a set?",
     ["python list to set",
      "turn a list into a set in python",
      "convert list into set python"],
     [("D", "How do I convert a Python set to a list?"),
      ("E", "How do I convert a Python list to a tuple?"),
      ("L", "How do I convert an array to a Set in JavaScript?")])

code("How do I base64 encode a string in Python?",
     ["python base64 encode string",
      "base64 encoding a string with python",
      "how to convert a string to base64 in python"],
     [("D", "How do I base64 decode a string in Python?"),
      ("L", "How do I base64 encode a string in JavaScript?"),
      ("E", "How do I URL-encode a string in Python?")])

code("How do I make an HTTP request with curl and include a bearer token?",
     ["curl with bearer token",
      "curl authorization bearer header",
      "how to send an Authorization: Bearer token using curl"],
     [("E", "How do I make an HTTP request with curl using basic auth?"),
      ("B", "How do I send a bearer token with wget?"),
      ("N", "How do I make a curl request without following redirects?")])

# ---------------------------------------------------------------------------
# GENERAL
# ---------------------------------------------------------------------------
gen("How many kilometers are in 5 miles?",
    ["5 miles to km",
     "convert 5 miles into kilometers",
     "what is 5 mi in kilometres"],
    [("D", "How many miles are in 5 kilometers?"),
     ("U", "How many kilometers are in 15 miles?"),
     ("E", "How many meters are in 5 miles?")])

gen("What is the capital of Australia?",
    ["capital of australia",
     "what's australia's capital city",
     "which city is the capital of Australia?"],
    [("E", "What is the capital of Austria?"),
     ("O", "What is the largest city in Australia?")])

gen("What is the boiling point of water in Fahrenheit?",
    ["water boiling point fahrenheit",
     "at what temperature in °F does water boil",
     "boiling temp of water in F"],
    [("E", "What is the boiling point of water in Kelvin?"),
     ("D", "What is the freezing point of water in Fahrenheit?"),
     ("O", "What is the boiling point of water in Fahrenheit at 10,000 feet of altitude?")])

gen("Who wrote Pride and Prejudice?",
    ["author of pride and prejudice",
     "who is the author of the novel Pride and Prejudice?",
     "pride and prejudice was written by who"],
    [("O", "When was Pride and Prejudice published?"),
     ("E", "Who wrote Jane Eyre?")])

gen("If I have 12 apples and give away 5, how many do I have left?",
    ["12 apples minus 5 given away, how many remain?",
     "I had 12 apples and gave 5 away. How many apples are left?",
     "how many apples remain if you start with 12 and give away 5"],
    [("U", "If I have 12 apples and give away 7, how many do I have left?"),
     ("D", "If I have 12 apples and get 5 more, how many do I have?")])

gen("What is 15% of 80?",
    ["15 percent of 80",
     "calculate 15% of 80",
     "how much is fifteen percent of 80?"],
    [("U", "What is 15% of 90?"),
     ("D", "80 is 15% of what number?"),
     ("D", "What percentage of 80 is 15?")])

gen("How long should I boil an egg to get a hard-boiled yolk?",
    ["how many minutes to hard boil an egg",
     "hard boiled egg boiling time",
     "how long do you boil an egg to make it hard boiled?"],
    [("O", "How long should I boil an egg to get a soft, runny yolk?"),
     ("E", "How long should I boil a quail egg to get a hard-boiled yolk?"),
     ("N", "How do I make hard-boiled eggs without boiling water?")])

gen("What is a normal resting heart rate for an adult?",
    ["normal resting heart rate adults",
     "what's a healthy resting pulse for a grown-up",
     "typical adult resting heart rate range"],
    [("E", "What is a normal resting heart rate for a newborn?"),
     ("O", "What is a normal blood pressure for an adult?")])

gen("How much will $1,000 grow to in 5 years at 5% annual interest compounded yearly?",
    ["$1000 at 5% compounded annually for 5 years",
     "future value of 1000 dollars after 5 years at 5% yearly compounding",
     "if I invest $1,000 at 5% per year compounded annually, what will I have after 5 years?"],
    [("U", "How much will $1,000 grow to in 10 years at 5% annual interest compounded yearly?"),
     ("O", "How much will $1,000 grow to in 5 years at 5% simple interest?"),
     ("D", "How much do I need to invest now at 5% compounded yearly to have $1,000 in 5 years?")])

gen("What's the difference between affect and effect?",
    ["affect vs effect",
     "when do I use affect and when effect",
     "difference between 'affect' and 'effect' in english"],
    [("E", "What's the difference between accept and except?"),
     ("L", "What's the difference between 'ser' and 'estar' in Spanish?")])

gen("How do you say 'thank you' in Japanese?",
    ["thank you in japanese",
     "what's the japanese word for thank you",
     "how to say thanks in Japanese"],
    [("L", "How do you say 'thank you' in Korean?"),
     ("O", "How do you say 'you're welcome' in Japanese?"),
     ("L", "How do you say 'thank you' in Mandarin?")])

gen("What is the speed of light in a vacuum?",
    ["speed of light vacuum",
     "how fast does light travel in a vacuum",
     "what's the speed of light in empty space"],
    [("E", "What is the speed of sound in air?"),
     ("O", "How long does light take to travel from the Sun to Earth?"),
     ("E", "What is the speed of light in water?")])

gen("What is the longest river in Africa?",
    ["longest river africa",
     "which river is the longest in Africa?",
     "africa's longest river"],
    [("E", "What is the longest river in South America?"),
     ("O", "What is the largest lake in Africa?"),
     ("U", "What is the second longest river in Africa?"),
     ("N", "What is the longest river in Africa that doesn't flow into the Mediterranean?")])

gen("When did World War II end?",
    ["ww2 end date",
     "when did the second world war end",
     "when was the end of WWII"],
    [("D", "When did World War II start?"),
     ("U", "When did World War I end?"),
     ("O", "Who won World War II?")])

gen("How many cups are in a quart?",
    ["cups in a quart",
     "how many cups make a quart",
     "1 quart = how many cups"],
    [("E", "How many cups are in a gallon?"),
     ("U", "How many cups are in 3 quarts?"),
     ("E", "How many pints are in a quart?")])

gen("What is the area of a circle with a radius of 4 cm?",
    ["area of circle radius 4cm",
     "circle with r = 4 cm, what's its area",
     "calculate the area of a circle whose radius is 4 centimeters"],
    [("E", "What is the area of a circle with a diameter of 4 cm?"),
     ("O", "What is the circumference of a circle with a radius of 4 cm?"),
     ("U", "What is the area of a circle with a radius of 6 cm?")])

gen("What is 25 degrees Celsius in Fahrenheit?",
    ["25 c to f",
     "convert 25°C to Fahrenheit",
     "25 celcius in fahrenheit"],
    [("D", "What is 25 degrees Fahrenheit in Celsius?"),
     ("U", "What is 35 degrees Celsius in Fahrenheit?"),
     ("E", "What is 25 degrees Celsius in Kelvin?")])

gen("How much water should an adult drink per day?",
    ["daily water intake for adults",
     "how much water should a grown person drink a day",
     "recommended water per day for an adult"],
    [("E", "How much water should a dog drink per day?"),
     ("O", "How much caffeine can an adult safely have per day?")])

gen("What is a Roth IRA?",
    ["roth ira explained",
     "can you explain what a Roth IRA is",
     "what's a roth ira account"],
    [("E", "What is a traditional IRA?"),
     ("O", "What is the Roth IRA contribution limit for 2024?"),
     ("N", "Who is not eligible to contribute to a Roth IRA?")])

gen("What are the products of photosynthesis?",
    ["photosynthesis products",
     "what does photosynthesis produce",
     "what are the outputs of photosynthesis"],
    [("D", "What are the reactants of photosynthesis?"),
     ("E", "What are the products of cellular respiration?"),
     ("O", "Where does photosynthesis take place in a plant cell?")])

gen("What is 7 times 8?",
    ["7 x 8",
     "7*8",
     "what's seven multiplied by eight"],
    [("U", "What is 7 times 9?"),
     ("O", "What is 7 plus 8?"),
     ("D", "What is 56 divided by 8?")])

gen("How tall is Mount Everest in meters?",
    ["mount everest height meters",
     "what's the height of Everest in metres",
     "everest elevation in m"],
    [("E", "How tall is Mount Everest in feet?"),
     ("E", "How tall is K2 in meters?"),
     ("O", "Where is Mount Everest located?")])

gen("Who was the first president of the United States?",
    ["first us president",
     "who was the 1st president of the USA",
     "who served as America's first president?"],
    [("U", "Who was the third president of the United States?"),
     ("E", "Who was the first prime minister of Canada?"),
     ("O", "When did the first president of the United States take office?")])

gen("What can I substitute for buttermilk in a recipe?",
    ["buttermilk substitute",
     "what to use instead of buttermilk in a recipe",
     "replacement for buttermilk when baking"],
    [("E", "What can I substitute for heavy cream in a recipe?"),
     ("D", "What can I use buttermilk as a substitute for?"),
     ("N", "How do I make a buttermilk substitute without any dairy?")])

gen("What is the plural of cactus?",
    ["plural of cactus",
     "cactus plural form",
     "what do you call more than one cactus"],
    [("E", "What is the plural of octopus?"),
     ("D", "What is the singular of cacti?"),
     ("L", "What is the plural of 'cactus' in Spanish?")])

gen("A train travels 240 km in 3 hours. What is its average speed?",
    ["train goes 240 km in 3 hours, average speed?",
     "what's the average speed of a train that covers 240 kilometers in 3 hours",
     "240 km in 3 h - average speed of the train"],
    [("U", "A train travels 240 km in 4 hours. What is its average speed?"),
     ("D", "A train travels at 240 km/h for 3 hours. How far does it go?"),
     ("E", "A train travels 240 miles in 3 hours. What is its average speed in km/h?")])

gen("What is the chemical symbol for gold?",
    ["gold chemical symbol",
     "symbol of gold on the periodic table",
     "what's gold's element symbol"],
    [("E", "What is the chemical symbol for silver?"),
     ("O", "What is the atomic number of gold?"),
     ("D", "Which element has the chemical symbol Au?")])

gen("What currency is used in Switzerland?",
    ["switzerland currency",
     "what money do they use in Switzerland",
     "which currency do the Swiss use"],
    [("E", "What currency is used in Sweden?"),
     ("O", "What are the official languages of Switzerland?")])

gen("What are the symptoms of dehydration?",
    ["dehydration symptoms",
     "signs that you're dehydrated",
     "how can I tell if I'm dehydrated"],
    [("O", "How do you treat dehydration?"),
     ("D", "What are the symptoms of overhydration?"),
     ("E", "What are the symptoms of dehydration in babies?")])

gen("What is the past tense of swim?",
    ["past tense of swim",
     "swim past tense",
     "what's the simple past of 'to swim'"],
    [("O", "What is the past participle of swim?"),
     ("E", "What is the past tense of sing?"),
     ("L", "What is the past tense of 'nadar' in Spanish?")])

gen("Solve for x: 3x + 7 = 22",
    ["3x + 7 = 22 solve x",
     "what is x if 3x+7=22",
     "find x in 3x + 7 = 22"],
    [("U", "Solve for x: 3x + 7 = 28"),
     ("D", "Solve for x: 3x - 7 = 22"),
     ("O", "Solve for x: 3x + 7 > 22")])

gen("What time zone is Tokyo in?",
    ["tokyo time zone",
     "which timezone does Tokyo use",
     "tokyo tz"],
    [("E", "What time zone is Sydney in?"),
     ("O", "What is the time difference between Tokyo and New York?")])

gen("What year did the Berlin Wall fall?",
    ["berlin wall fall year",
     "when did the berlin wall come down",
     "what year was the fall of the berlin wall"],
    [("D", "What year was the Berlin Wall built?"),
     ("O", "Why did the Berlin Wall fall?"),
     ("E", "What year did the Soviet Union collapse?")])

gen("At what temperature and for how long should I bake chicken breasts?",
    ["baking chicken breast temp and time",
     "oven temperature and cooking time for chicken breast",
     "how long and at what temp do you bake chicken breasts"],
    [("E", "At what temperature and for how long should I bake chicken thighs?"),
     ("B", "How long should I cook chicken breasts in an air fryer?"),
     ("N", "How do I cook chicken breasts without an oven?")])

gen("How many grams are in 8 ounces?",
    ["8 oz to grams",
     "convert 8 ounces to g",
     "8 ounces in grams"],
    [("D", "How many ounces are in 8 grams?"),
     ("U", "How many grams are in 12 ounces?"),
     ("E", "How many milliliters are in 8 fluid ounces?")])

gen("What is the largest planet in our solar system?",
    ["largest planet solar system",
     "which planet is the biggest in the solar system",
     "biggest planet in our solar system?"],
    [("D", "What is the smallest planet in our solar system?"),
     ("U", "What is the second largest planet in our solar system?"),
     ("O", "What is the hottest planet in our solar system?")])

gen("What is the percentage increase from 50 to 65?",
    ["percent increase 50 to 65",
     "how much percent is it from 50 up to 65",
     "calculate % increase from 50 to 65"],
    [("D", "What is the percentage decrease from 65 to 50?"),
     ("U", "What is the percentage increase from 50 to 75?")])

gen("When should I use 'who' versus 'whom'?",
    ["who vs whom",
     "difference between who and whom",
     "how do I know whether to use who or whom"],
    [("E", "When should I use 'fewer' versus 'less'?"),
     ("L", "When should I use 'tu' versus 'vous' in French?")])

gen("What foods are high in vitamin D?",
    ["foods rich in vitamin d",
     "vitamin D food sources",
     "which foods contain a lot of vitamin D"],
    [("E", "What foods are high in vitamin C?"),
     ("O", "Which vegan foods are high in vitamin D?"),
     ("N", "What foods are high in vitamin D that aren't fish?")])

gen("What is the average of 4, 8, 15, 16 and 23?",
    ["average of 4 8 15 16 23",
     "mean of 4, 8, 15, 16, 23",
     "calculate the mean of these numbers: 4, 8, 15, 16, 23"],
    [("O", "What is the median of 4, 8, 15, 16 and 23?"),
     ("U", "What is the average of 4, 8, 15, 16, 23 and 42?"),
     ("N", "What is the average of 4, 8, 15, 16 and 23, excluding the largest number?")])

gen("What is the population of Canada?",
    ["canada population",
     "how many people live in Canada",
     "what's the number of people living in canada"],
    [("E", "What is the population of Australia?"),
     ("O", "What is the land area of Canada?")])

gen("What is the water to rice ratio for white rice?",
    ["white rice water ratio",
     "how much water for white rice",
     "how many cups of water per cup of white rice"],
    [("E", "What is the water to rice ratio for brown rice?"),
     ("B", "What is the water to rice ratio for white rice in an Instant Pot?"),
     ("U", "How much water do I need for 3 cups of white rice?")])

gen("How many meters is 6 feet?",
    ["6 feet in meters",
     "6 ft to m",
     "convert six feet to meters"],
    [("D", "How many feet is 6 meters?"),
     ("U", "How many meters is 6 feet 2 inches?"),
     ("E", "How many yards is 6 feet?")])

gen("What is the difference between DNA and RNA?",
    ["dna vs rna",
     "how does DNA differ from RNA",
     "differences between dna and rna"],
    [("E", "What is the difference between mitosis and meiosis?"),
     ("O", "What does DNA stand for?")])

gen("Who painted the Mona Lisa?",
    ["mona lisa painter",
     "who is the artist of the Mona Lisa",
     "which artist painted the mona lisa"],
    [("O", "Where is the Mona Lisa displayed?"),
     ("E", "Who painted The Starry Night?"),
     ("O", "When was the Mona Lisa painted?")])

gen("How much is a 20% tip on a $45 bill?",
    ["20% tip on $45",
     "tip 20 percent on 45 dollars",
     "what should I tip on a $45 check at 20%"],
    [("U", "How much is a 15% tip on a $45 bill?"),
     ("U", "How much is a 20% tip on an $85 bill?"),
     ("O", "What is the total of a $45 bill including a 20% tip?")])

gen("What is a synonym for 'happy'?",
    ["synonym for happy",
     "another word for happy",
     "what's a word that means happy"],
    [("D", "What is an antonym for 'happy'?"),
     ("E", "What is a synonym for 'sad'?"),
     ("L", "What is the Spanish word for 'happy'?")])

gen("What is 3/4 plus 2/3?",
    ["3/4 + 2/3",
     "add three quarters and two thirds",
     "sum of 3/4 and 2/3"],
    [("D", "What is 3/4 minus 2/3?"),
     ("U", "What is 3/4 plus 1/3?"),
     ("O", "What is 3/4 times 2/3?")])

gen("How many calories are in a pound of body fat?",
    ["calories in one pound of fat",
     "1 lb of body fat = how many calories",
     "how many kcal does a pound of body fat contain"],
    [("E", "How many calories are in a kilogram of body fat?"),
     ("O", "How many calories should I eat per day to lose weight?"),
     ("U", "How many calories are in 5 pounds of body fat?")])

gen("Which countries border Germany?",
    ["countries bordering germany",
     "what countries share a border with Germany",
     "germany's neighboring countries"],
    [("E", "Which countries border Switzerland?"),
     ("N", "Which European countries do not border Germany?")])

gen("How many teaspoons are in a tablespoon?",
    ["teaspoons in a tablespoon",
     "tbsp to tsp",
     "1 tablespoon equals how many teaspoons"],
    [("D", "How many tablespoons are in a teaspoon?"),
     ("U", "How many teaspoons are in 3 tablespoons?"),
     ("E", "How many tablespoons are in a cup?")])

gen("Why is the sky blue?",
    ["why's the sky blue",
     "what makes the sky look blue",
     "reason the sky is blue"],
    [("O", "Why is the sky red at sunset?"),
     ("E", "Why is the ocean blue?"),
     ("N", "Why isn't the sky violet?")])

gen("When was the Magna Carta signed?",
    ["magna carta signed year",
     "what year was the magna carta sealed",
     "magna carta date"],
    [("O", "Who signed the Magna Carta?"),
     ("E", "When was the Declaration of Independence signed?")])

gen("What is the probability of rolling a sum of 7 with two dice?",
    ["probability sum 7 two dice",
     "chance of rolling a 7 with 2 dice",
     "what's the likelihood of getting a total of seven when rolling two six-sided dice"],
    [("U", "What is the probability of rolling a sum of 8 with two dice?"),
     ("U", "What is the probability of rolling a sum of 7 with three dice?"),
     ("N", "What is the probability of not rolling a sum of 7 with two dice?")])

gen("How many liters are in a US gallon?",
    ["liters in a us gallon",
     "1 US gallon to liters",
     "how many litres is one american gallon"],
    [("E", "How many liters are in an imperial gallon?"),
     ("D", "How many US gallons are in a liter?"),
     ("U", "How many liters are in 5 US gallons?")])

gen("How long does the flu usually last?",
    ["flu duration",
     "how many days does influenza usually last",
     "how long are you typically sick with the flu"],
    [("E", "How long does a common cold usually last?"),
     ("O", "How long is the flu contagious?")])

gen("What is the monthly payment on a $300,000 mortgage at 6% for 30 years?",
    ["monthly payment $300k mortgage 6% 30 year",
     "300,000 home loan at 6 percent over 30 years - monthly payment?",
     "calculate the monthly mortgage payment for $300,000, 6% interest, 30-year term"],
    [("U", "What is the monthly payment on a $300,000 mortgage at 6% for 15 years?"),
     ("O", "What is the total interest paid on a $300,000 mortgage at 6% for 30 years?"),
     ("D", "How big a mortgage can I get at 6% for 30 years with a $1,800 monthly payment?"),
     ("U", "What is the monthly payment on a $400,000 mortgage at 6% for 30 years?")])

gen("How do you say 'good morning' in French?",
    ["good morning in french",
     "french for good morning",
     "what's 'good morning' in French"],
    [("L", "How do you say 'good morning' in Italian?"),
     ("O", "How do you say 'good night' in French?"),
     ("D", "What does 'bonjour' mean in English?")])

gen("Which ocean is the largest?",
    ["largest ocean",
     "what is the biggest ocean on earth",
     "which ocean is biggest in the world"],
    [("D", "Which ocean is the smallest?"),
     ("O", "Which ocean is the warmest?"),
     ("U", "Which ocean is the second largest?")])

gen("How many bones are in the adult human body?",
    ["number of bones in the adult human body",
     "how many bones does an adult have",
     "adult human bone count"],
    [("E", "How many bones are in a newborn baby's body?"),
     ("E", "How many bones are in the human hand?"),
     ("O", "What is the largest bone in the human body?")])

gen("What is the square root of 144?",
    ["sqrt 144",
     "square root of 144",
     "what's √144"],
    [("D", "What is 144 squared?"),
     ("U", "What is the square root of 169?"),
     ("O", "What is the cube root of 144?")])

gen("What is 350°F in Celsius for baking?",
    ["350 f to c oven",
     "convert 350 degrees fahrenheit to celsius",
     "oven at 350F, what's that in C"],
    [("U", "What is 400°F in Celsius for baking?"),
     ("D", "What is 350°C in Fahrenheit?"),
     ("E", "What gas mark is 350°F?")])

gen("When did the Western Roman Empire fall?",
    ["fall of western roman empire date",
     "what year did the western roman empire collapse",
     "when was the end of the western roman empire"],
    [("E", "When did the Eastern Roman Empire fall?"),
     ("O", "Why did the Western Roman Empire fall?"),
     ("D", "When was the Roman Empire founded?")])

gen("What is the difference between a stock and a bond?",
    ["stock vs bond",
     "how are stocks different from bonds",
     "difference between stocks and bonds"],
    [("E", "What is the difference between a stock and an ETF?"),
     ("N", "What investments are neither stocks nor bonds?")])

gen("When should I use a semicolon?",
    ["semicolon usage rules",
     "how do you use a semicolon correctly",
     "when to use a semicolon in a sentence"],
    [("E", "When should I use a colon?"),
     ("N", "When should I not use a semicolon?")])

gen("What is the BMI of someone who is 180 cm tall and weighs 75 kg?",
    ["bmi 180cm 75kg",
     "calculate BMI for height 180 cm, weight 75 kg",
     "what's my bmi if I'm 180 cm and 75 kilos"],
    [("U", "What is the BMI of someone who is 170 cm tall and weighs 75 kg?"),
     ("U", "What is the BMI of someone who is 180 cm tall and weighs 90 kg?"),
     ("O", "What is a healthy weight range for someone who is 180 cm tall?")])

gen("What's a simple recipe for pancakes?",
    ["easy pancake recipe",
     "how do I make simple pancakes",
     "basic pancakes recipe from scratch"],
    [("N", "What's a simple recipe for pancakes without eggs?"),
     ("N", "What's a simple recipe for pancakes without milk?"),
     ("U", "What's a simple recipe for pancakes for 12 people?"),
     ("E", "What's a simple recipe for crepes?")])

gen("Which fruits are safe for dogs to eat?",
    ["fruits dogs can eat",
     "what fruit can I safely give my dog",
     "safe fruits for dogs"],
    [("N", "Which fruits should dogs never eat?"),
     ("E", "Which fruits are safe for cats to eat?"),
     ("O", "Which vegetables are safe for dogs to eat?")])

gen("Which numbers between 1 and 20 are prime?",
    ["prime numbers between 1 and 20",
     "list the primes from 1 to 20",
     "what are the prime numbers up to 20"],
    [("N", "Which numbers between 1 and 20 are not prime?"),
     ("U", "Which numbers between 1 and 50 are prime?"),
     ("O", "How many numbers between 1 and 20 are prime?")])

gen("Which expenses are tax deductible for freelancers in the US?",
    ["tax deductible expenses freelancer us",
     "what can freelancers in the US deduct on their taxes",
     "US freelancer deductible expenses"],
    [("N", "Which expenses are not tax deductible for freelancers in the US?"),
     ("E", "Which expenses are tax deductible for freelancers in the UK?")])

gen("Is 'data' singular or plural?",
    ["data singular or plural",
     "should I say 'data is' or 'data are'",
     "is the word data plural or singular"],
    [("E", "Is 'media' singular or plural?"),
     ("E", "Is 'news' singular or plural?")])

gen("How do I make cold brew coffee?",
    ["cold brew coffee how to",
     "cold brew recipe",
     "steps to make cold brew coffee at home"],
    [("E", "How do I make iced coffee?"),
     ("N", "How do I make coffee without a coffee maker?"),
     ("U", "How much coffee do I need to make 2 liters of cold brew?")])

gen("What are good sources of protein for vegetarians?",
    ["vegetarian protein sources",
     "where can vegetarians get protein",
     "high-protein foods for vegetarians"],
    [("N", "What are good sources of protein for vegetarians that aren't soy?"),
     ("E", "What are good sources of protein for vegans?"),
     ("O", "How many grams of protein does a vegetarian need per day?")])

gen("Which countries in Europe use the euro?",
    ["list of european countries that use the euro",
     "what european countries use the euro",
     "european countries using the euro as currency"],
    [("N", "Which countries in Europe don't use the euro?"),
     ("O", "How many countries in Europe use the euro?"),
     ("E", "Which countries use the US dollar besides the USA?")])

gen("How many days are there in February in a leap year?",
    ["days in february leap year",
     "how many days does february have in a leap year",
     "leap year february number of days"],
    [("N", "How many days are there in February in a non-leap year?"),
     ("O", "How many days are there in a leap year?")])

gen("What are the side effects of ibuprofen?",
    ["ibuprofen side effects",
     "what side effects can ibuprofen cause",
     "possible adverse effects of taking ibuprofen"],
    [("E", "What are the side effects of acetaminophen?"),
     ("N", "Who should not take ibuprofen?"),
     ("O", "What is the maximum daily dose of ibuprofen?")])

gen("How do I convert 2 hours and 45 minutes to minutes?",
    ["2 hours 45 minutes in minutes",
     "how many minutes is 2h 45m",
     "convert 2 hr 45 min into minutes"],
    [("U", "How do I convert 3 hours and 45 minutes to minutes?"),
     ("E", "How do I convert 2 hours and 45 minutes to seconds?"),
     ("D", "How do I convert 245 minutes to hours and minutes?")])

gen("Translate 'where is the train station' into German",
    ["where is the train station in german",
     "how do you say 'where is the train station' in German",
     "german translation of 'where is the train station'"],
    [("L", "Translate 'where is the train station' into Dutch"),
     ("E", "Translate 'where is the bus stop' into German"),
     ("D", "Translate 'Wo ist der Bahnhof?' into English")])

gen("What is the population density formula?",
    ["formula for population density",
     "how do you calculate population density",
     "population density calculation"],
    [("O", "What is the population growth rate formula?"),
     ("E", "What is the formula for density in physics?")])


# ---------------------------------------------------------------------------
# Expansion
# ---------------------------------------------------------------------------
def build():
    rows = []
    for gi, grp in enumerate(GROUPS):
        gid = "h%03d" % (gi + 1)
        dom = grp["domain"]
        base, paras, traps = grp["base"], grp["paras"], grp["traps"]
        assert 2 <= len(paras) <= 4, (gid, base)
        assert 2 <= len(traps) <= 4, (gid, base)

        def add(a, b, label, cat):
            rows.append({"group": gid, "domain": dom, "a": a, "b": b,
                         "label": label, "category": cat})

        # base <-> paraphrases (hits); sometimes the paraphrase is the cached prompt
        for pi, p in enumerate(paras):
            if (gi + pi) % 3 == 1:
                add(p, base, "hit", "paraphrase")
            else:
                add(base, p, "hit", "paraphrase")
        # paraphrase <-> paraphrase (hits)
        k = gi % len(paras)
        add(paras[k], paras[(k + 1) % len(paras)], "hit", "paraphrase")
        if gi % 3 == 0 and len(paras) >= 3:
            add(paras[(k + 2) % len(paras)], paras[(k + 1) % len(paras)], "hit", "paraphrase")
        # base <-> traps (misses); sometimes the trap is the cached prompt
        for ti, (c, t) in enumerate(traps):
            if (gi + ti) % 4 == 3:
                add(t, base, "miss", CAT[c])
            else:
                add(base, t, "miss", CAT[c])
        # paraphrase <-> trap (miss): pick the trap whose category is rarest so far,
        # to keep the trap categories balanced
        counts = collections.Counter(r["category"] for r in rows if r["label"] == "miss")
        order = [(counts[CAT[c]], (ti - gi) % len(traps), ti) for ti, (c, _) in enumerate(traps)]
        j = min(order)[2]
        c, t = traps[j]
        add(paras[(k + 2) % len(paras)], t, "miss", CAT[c])
    for i, r in enumerate(rows):
        r_id = {"id": "ho-%04d" % i}
        r_id.update(r)
        rows[i] = r_id
    return rows


def validate(rows):
    errors = []
    fields = ["id", "group", "domain", "a", "b", "label", "category"]
    seen = set()
    for i, r in enumerate(rows):
        for f in fields:
            if f not in r or not isinstance(r[f], str) or not r[f].strip():
                errors.append("missing/empty %s in row %d" % (f, i))
        if r["id"] != "ho-%04d" % i:
            errors.append("bad id %s at %d" % (r["id"], i))
        if r["domain"] not in ("code", "general"):
            errors.append("bad domain %r" % r["domain"])
        if r["label"] not in ("hit", "miss"):
            errors.append("bad label %r" % r["label"])
        if r["label"] == "hit" and r["category"] != "paraphrase":
            errors.append("hit with category %s" % r["category"])
        if r["label"] == "miss" and r["category"] not in CAT.values():
            errors.append("miss with category %s" % r["category"])
        if r["a"] == r["b"]:
            errors.append("a == b in %s" % r["id"])
        key = (r["a"], r["b"])
        rkey = (r["b"], r["a"])
        if key in seen or rkey in seen:
            errors.append("duplicate pair %r" % (key,))
        seen.add(key)
    # every text belongs to exactly one group / role
    owner = {}
    for gi, grp in enumerate(GROUPS):
        texts = [("base", grp["base"])] + [("para", p) for p in grp["paras"]] + \
                [("trap", t) for _, t in grp["traps"]]
        for role, t in texts:
            norm = " ".join(t.lower().split())
            if norm in owner:
                errors.append("text reused: %r (%s / %s)" % (t, owner[norm], (gi, role)))
            owner[norm] = (gi, role)
    # group ids sequential
    gids = sorted({r["group"] for r in rows})
    exp = ["h%03d" % (i + 1) for i in range(len(GROUPS))]
    if gids != exp:
        errors.append("group ids not sequential")
    return errors


def main():
    rows = build()
    errors = validate(rows)
    if errors:
        for e in errors:
            print("ERROR:", e)
        sys.exit(1)
    dev_texts = set()
    for path in DEV:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                d = json.loads(line)
                dev_texts |= {d["a"].lower().strip(), d["b"].lower().strip()}
    before = len(rows)
    rows = [r for r in rows if r["a"].lower().strip() not in dev_texts and r["b"].lower().strip() not in dev_texts]
    for r in rows:
        r["id"] = r["id"].replace("ho-", "test2-")
    print("dropped", before - len(rows), "pairs sharing a text with the dev pairs")
    with open(OUT, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")

    lab = collections.Counter(r["label"] for r in rows)
    cat = collections.Counter(r["category"] for r in rows)
    dom = collections.Counter(r["domain"] for r in rows)
    dom_lab = collections.Counter((r["domain"], r["label"]) for r in rows)
    gdom = collections.Counter(gr["domain"] for gr in GROUPS)
    print("wrote", OUT)
    print("groups:", len(GROUPS), dict(gdom))
    print("pairs:", len(rows))
    print("labels:", dict(lab))
    print("domains:", dict(dom))
    print("domain x label:", {"%s/%s" % k: v for k, v in sorted(dom_lab.items())})
    print("categories:")
    for c, n in sorted(cat.items(), key=lambda x: -x[1]):
        print("  %-11s %d" % (c, n))
    # hard requirements
    assert len(rows) >= 700
    assert lab["hit"] >= 350 and lab["miss"] >= 350
    for c in CAT.values():
        assert cat[c] >= 35, c
    print("all checks passed")


if __name__ == "__main__":
    main()
