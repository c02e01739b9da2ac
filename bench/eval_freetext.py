"""Free-text personal data for the classifier eval: names, street addresses, dates of birth, ages.

Part of ``make eval-classifier`` (:mod:`bench.eval_classifier` calls
:func:`section`). Each positive text marks its span (kind, start, end). Texts
come in two halves that are reported apart:

- ``dev``: the templates and locales (en_US, en_GB, de_DE, fr_FR) the rules
  were written looking at;
- ``held-out``: other templates and other locales (it_IT, es_ES, nl_NL,
  pt_PT, plus en_IE and de_AT), never looked at while writing the rules. The
  difference between the two rows is what the rules overfit to the generator.

The hard clean set is written to look like what must stay ``pii-none``:
capitalised products after "I'm using" / "this is", cities in travel
questions, famous people in history questions (born in a year, on a date),
code identifiers (``first_name``, YAML ``name: Build``), and dates that are not
a birth (invoices, releases, deadlines); and one kind nobody here wrote:
2 KB pieces of installed packages' source (aiohttp, msgspec, structlog,
nats-py), whose identifiers, docstrings and examples are real clean text.

Recall per kind counts a text as found when its tag is ``pii-confirmed`` or
``pii-unknown``; "as this kind" also needs a candidate of that kind judged
confirmed/unknown over the marked span.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from faker import Faker

KINDS = ("person", "address", "dob", "age")
DEV_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR")
HELD_OUT_LOCALES = ("it_IT", "es_ES", "nl_NL", "pt_PT", "en_IE", "de_AT")

#: {v} is the span; {a}/{b} filler sentences; templates per language family
PERSON_DEV = {
    "en": ("{a} My name is {v}. {b}", "Dear {v},\n{a}", "{a}\n\nBest regards,\n{v}", "Hi, I'm {v}, {b}",
           "Name: {v}\n{a}", "{a} Signed, {v}"),
    "de": ("Mein Name ist {v}. {a}", "Hallo {v},\n{a}", "{a}\n\nMit freundlichen Grüßen\n{v}", "Name: {v}\n{a}"),
    "fr": ("Je m'appelle {v}. {a}", "Bonjour {v},\n{a}", "{a}\n\nCordialement,\n{v}", "Nom : {v}\n{a}"),
}
PERSON_HELD = {
    "en": ("Hello, this is {v} from accounting. {a}", "{a}\nThanks,\n{v}", "Customer: {v}\n{a}",
           "{a} You can call me {v}. {b}", "Hey {v},\n{a}"),
    "de": ("Ich heiße {v} und {a}", "Liebe {v},\n{a}", "{a}\nViele Grüße\n{v}"),
    "fr": ("Mon nom est {v}. {a}", "{a}\nBien à vous,\n{v}"),
    "it": ("Mi chiamo {v}. {a}", "Ciao {v},\n{a}", "{a}\nCordiali saluti\n{v}", "Nome: {v}\n{a}"),
    "es": ("Me llamo {v}. {a}", "Hola {v},\n{a}", "{a}\nSaludos,\n{v}", "Nombre: {v}\n{a}"),
    "nl": ("Mijn naam is {v}. {a}", "Beste {v},\n{a}", "{a}\nMet vriendelijke groet,\n{v}"),
    "pt": ("{a}\nAtentamente,\n{v}", "Olá {v},\n{a}"),
}
ADDRESS_DEV = ("{a} I live at {v}. {b}", "{a} Ship to: {v}", "Address: {v}\n{a}", "{a} Please send it to {v}.")
ADDRESS_HELD = ("{a} my flat is at {v}, {b}", "Deliver to\n{v}\n{a}", "{a} (home: {v}) {b}",
                "We moved to {v} last spring. {a}")
DOB_DEV = ("{a} DOB: {v}. {b}", "{a} I was born on {v}. {b}", "Date of birth: {v}\n{a}",
           "Geburtsdatum: {v}\n{a}", "{a} Je suis né le {v}. {b}")
DOB_HELD = ("{a} my son was born {v} and {b}", "Birth date {v}; {a}", "{a} Fecha de nacimiento: {v}. {b}",
            "{a} Sono nata il {v}. {b}", "Geboortedatum: {v}\n{a}", "{a} Birthday: {v}. {b}")
AGE_DEV = ("{a} I'm {v} years old. {b}", "{a} Age: {v}. {b}", "{a} My daughter is {v} years old.")
AGE_HELD = ("{a} my husband, {v} years old, {b}", "{a} Ich bin {v} Jahre alt. {b}", "{a} J'ai {v} ans. {b}",
            "{a} Tengo {v} años. {b}", "{a} Ho {v} anni. {b}", "{a} I am a {v}-year-old nurse. {b}")

_MONTHS_EN = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December")

PRODUCTS = ("Visual Studio Code", "Google Cloud Run", "Microsoft Teams", "Apple Music", "Adobe Photoshop",
            "Android Studio", "Amazon Web Services", "Red Hat Enterprise Linux", "Final Cut Pro", "Unreal Engine",
            "Power BI", "Creative Cloud", "Azure DevOps", "Samsung Galaxy", "Nintendo Switch", "Logic Pro")
CITIES = ("Paris", "Rome", "Berlin", "Madrid", "Lisbon", "Amsterdam", "Vienna", "Prague", "Milan", "Barcelona",
          "Munich", "Lyon", "Porto", "Brussels", "Zurich", "Copenhagen", "New York", "San Francisco", "London")
FAMOUS = ("Napoleon Bonaparte", "Albert Einstein", "Marie Curie", "Julius Caesar", "Abraham Lincoln",
          "Winston Churchill", "Leonardo da Vinci", "Isaac Newton", "Queen Victoria", "Charles Darwin",
          "Otto von Bismarck", "Joan of Arc", "Galileo Galilei", "Catherine the Great", "Martin Luther",
          "Ada Lovelace", "Nelson Mandela", "Wolfgang Amadeus Mozart", "Karl Marx", "Simón Bolívar")


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    label: str  # kind, or "clean:<kind>"
    split: str = ""  # "dev" / "held-out" for positives
    spans: tuple[tuple[str, int, int], ...] = field(default=())


class FreeTextGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.fakers: dict[str, Faker] = {}

    def faker(self, locale: str) -> Faker:
        f = self.fakers.get(locale)
        if f is None:
            f = Faker(locale)
            f.seed_instance(self.seed + 17 * len(self.fakers))
            self.fakers[locale] = f
        return f

    def pick(self, seq):  # type: ignore[no-untyped-def]
        return seq[self.rng.randrange(len(seq))]

    def _fill(self, template: str, value: str, kind: str, split: str) -> Text:
        f = self.faker("en_US")
        a = f.sentence(nb_words=self.rng.randint(4, 12))
        b = f.sentence(nb_words=self.rng.randint(4, 12))
        before = template.split("{v}")[0].format(a=a, b=b)
        text = template.format(v=value, a=a, b=b)
        return Text(text, kind, split, ((kind, len(before), len(before) + len(value)),))

    def _lang(self, locale: str) -> str:
        return locale[:2]

    def person(self, split: str) -> Text:
        locales = DEV_LOCALES if split == "dev" else HELD_OUT_LOCALES
        loc = self.pick(locales)
        f = self.faker(loc)
        value = f"{f.first_name()} {f.last_name()}" if self.rng.random() < 0.8 else f.first_name()
        table = PERSON_DEV if split == "dev" else PERSON_HELD
        return self._fill(self.pick(table.get(self._lang(loc), table["en"])), value, "person", split)

    def address(self, split: str) -> Text:
        loc = self.pick(DEV_LOCALES if split == "dev" else HELD_OUT_LOCALES)
        f = self.faker(loc)
        street = f.street_address().replace("\n", ", ")
        tail = f"{f.postcode()} {f.city()}" if loc[:2] != "en" else f"{f.city()} {f.postcode()}"
        value = f"{street}, {tail}" if self.rng.random() < 0.8 else street
        return self._fill(self.pick(ADDRESS_DEV if split == "dev" else ADDRESS_HELD), value, "address", split)

    def _date(self) -> str:
        d = self.faker("en_US").date_of_birth(minimum_age=1, maximum_age=90)
        style = self.rng.randrange(5)
        if style == 0:
            return d.strftime("%d/%m/%Y")
        if style == 1:
            return d.strftime("%d.%m.%Y")
        if style == 2:
            return d.isoformat()
        if style == 3:
            return f"{d.day} {_MONTHS_EN[d.month - 1]} {d.year}"
        return f"{_MONTHS_EN[d.month - 1]} {d.day}, {d.year}"

    def dob(self, split: str) -> Text:
        return self._fill(self.pick(DOB_DEV if split == "dev" else DOB_HELD), self._date(), "dob", split)

    def age(self, split: str) -> Text:
        return self._fill(self.pick(AGE_DEV if split == "dev" else AGE_HELD), str(self.rng.randint(2, 95)), "age", split)

    # ----------------------------------------------------------------- clean

    def clean_products(self) -> str:
        p = self.pick(PRODUCTS)
        return self.pick((
            f"I'm using {p} and it crashes on startup. How do I reset it?",
            f"This is {p}, right? What does the free tier include?",
            f"I am on {p} version {self.rng.randint(2, 30)}. Is there a dark mode?",
            f"Compare {p} with {self.pick(PRODUCTS)} for a team of {self.rng.randint(3, 40)}.",
            f"Dear {p} support team: the installer fails with error {self.rng.randint(100, 999)}.",
            f"Hi all,\nwe are moving to {p} next quarter. Thoughts?",
        ))

    def clean_travel(self) -> str:
        a, b = self.pick(CITIES), self.pick(CITIES)
        return self.pick((
            f"Find flights from {a} to {b} on {self.rng.randint(1, 28)} {self.pick(_MONTHS_EN)} for 2 adults.",
            f"Is {self.rng.randint(2, 9)} days enough to see {a}? We arrive from {b}.",
            f"What is the fastest train from {a} to {b}, and how long does it take?",
            f"Recommend 3 museums in {a} near the main station, open on Sunday.",
            f"I'm flying to {a} in {self.pick(_MONTHS_EN)}; what's the weather like? Then {b}.",
            f"Hotels near 5th Avenue in {a}? Budget 150 euros a night, 4 nights.",
        ))

    def clean_history(self) -> str:
        p = self.pick(FAMOUS)
        y = self.rng.randint(1500, 1950)
        return self.pick((
            f"{p} was born in {y}. Why is {p} still famous today?",
            f"When did {p} die, and what were the causes?",
            f"Write a 500-word essay on {p} and the politics of the {y // 100 + 1}th century.",
            f"{p} was born on {self.rng.randint(1, 28)} {self.pick(_MONTHS_EN)} {y}; summarise the early years.",
            f"Who influenced {p} most? List 3 people and explain.",
            f"At the age of {self.rng.randint(20, 60)}, {p} changed everything. What happened?",
        ))

    def clean_identifiers(self) -> str:
        return self.pick((
            "class UserProfile:\n    first_name: str\n    last_name: str\n    street_address: str\n"
            "    def full_name(self) -> str:\n        return f'{self.first_name} {self.last_name}'\n",
            "jobs:\n  build:\n    name: Build and Test\n    runs-on: ubuntu-latest\n    steps:\n      - name: Run Tests\n",
            f"const MaxRetries = {self.rng.randint(2, 9)}\nfunc (s *StreetService) GetAddress(id int) (*Address, error)\n",
            "SELECT first_name, last_name, date_of_birth FROM customers WHERE age > 30 LIMIT 10;",
            "Rename the variable `customerName` to `clientName` in UserController and AddressParser.",
            f"docker run -p 8080:80 --name HelloWorld nginx:1.{self.rng.randint(10, 27)}",
        ))

    def clean_dates(self) -> str:
        d = self.faker("en_US").date_between("-30y", "+1y")
        ds = self.pick((d.strftime("%d/%m/%Y"), d.isoformat(), f"{d.day} {_MONTHS_EN[d.month - 1]} {d.year}"))
        return self.pick((
            f"The invoice dated {ds} is still unpaid; draft a reminder.",
            f"Version 4.{self.rng.randint(0, 20)} was released on {ds}. What changed?",
            f"The deadline is {ds}. Plan the 3 remaining sprints.",
            f"Our company was founded on {ds} in {self.pick(CITIES)}.",
            f"The meeting on {ds} was moved to room 12B.",
        ))


CLEAN: dict[str, Callable[[FreeTextGenerator], str]] = {
    "capitalised products": FreeTextGenerator.clean_products,
    "cities in travel questions": FreeTextGenerator.clean_travel,
    "famous people in history questions": FreeTextGenerator.clean_history,
    "code identifiers": FreeTextGenerator.clean_identifiers,
    "dates that are no birth": FreeTextGenerator.clean_dates,
}


def generate(per_kind: int, per_clean: int, seed: int) -> list[Text]:
    gen = FreeTextGenerator(seed)
    out: list[Text] = []
    for kind in KINDS:
        for split in ("dev", "held-out"):
            out += [getattr(gen, kind)(split) for _ in range(per_kind // 2)]
    for name, fn in CLEAN.items():
        out += [Text(fn(gen), f"clean:{name}") for _ in range(per_clean)]
    out += [Text(chunk, f"clean:{REAL_CODE}") for chunk in real_code(per_clean, gen.rng)]
    return out


#: the one clean kind not written by us: the source of packages the project installs
REAL_CODE = "real code and docstrings (aiohttp, msgspec, structlog, nats-py)"


def real_code(n: int, rng: random.Random, size: int = 2000) -> list[str]:
    """``n`` pieces of ``size`` characters of installed packages' own source (identifiers,
    docstrings, comments, examples: written by others, nothing generated), drawn with ``rng``."""
    import importlib.util
    from pathlib import Path

    files: list[Path] = []
    for package in ("aiohttp", "msgspec", "structlog", "nats"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            files += sorted(Path(spec.origin).parent.rglob("*.py"))
    chunks = []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        chunks += [text[i : i + size] for i in range(0, len(text) - size // 2, size)]
    return [chunks[i] for i in sorted(rng.sample(range(len(chunks)), min(n, len(chunks))))] if chunks else []


@dataclass
class Counts:
    n: int = 0
    tagged: int = 0  # confirmed or unknown
    as_kind: int = 0
    confirmed: int = 0


def _found_as(detector, text: str, span: tuple[str, int, int]) -> bool:  # type: ignore[no-untyped-def]
    from kinference_common.detectors.core import Verdict

    kind, s0, s1 = span
    scan = detector.scanner.scan(text)
    for index in scan.fired():
        rule = detector.rules[index]
        if rule.entity != kind:
            continue
        for start, end in scan.hits(index):
            if start < s1 + 4 and end > s0 - 40 and rule.validate(text, start, end) is not Verdict.NONE:
                return True
    return False


def evaluate(texts: list[Text], classifiers_by_name: dict[str, object]) -> dict[str, dict[str, Counts]]:
    """{variant: {row: Counts}}; rows are "kind/split" and "clean:<kind>"."""
    out: dict[str, dict[str, Counts]] = {}
    for name, cl in classifiers_by_name.items():
        rows: dict[str, Counts] = defaultdict(Counts)
        det = cl.detectors["pii"]  # type: ignore[attr-defined]
        for t in texts:
            reply = cl.classify("pii", [t.text])  # type: ignore[attr-defined]
            key = t.label if t.label.startswith("clean:") else f"{t.label}/{t.split}"
            r = rows[key]
            r.n += 1
            tag = reply.tags[0]
            if tag != "pii-none":
                r.tagged += 1
            if tag == "pii-confirmed":
                r.confirmed += 1
            if t.spans and _found_as(det, t.text, t.spans[0]):
                r.as_kind += 1
        out[name] = rows
    return out


def hard_clean_prose(kb: int, n: int = 8, seed: int = 5) -> list[str]:
    """``n`` texts of ``kb`` KB made of the hard clean kinds, one after another (the latency
    benches' free-text content: capitalised words, numbers and dates that are no PII)."""
    gen = FreeTextGenerator(seed)
    out = []
    for _ in range(n):
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < kb * 1024:
            parts.append(gen.pick(list(CLEAN.values()))(gen))
        out.append("\n".join(parts)[: kb * 1024])
    return out


def latency(classifiers_by_name: dict[str, object], rounds: int = 400) -> dict[str, dict[tuple[int, str], tuple[float, float]]]:
    """In-process p50/p99 (microseconds) per size for each variant, on bench.classifier's prompts
    and on prose with names and addresses of the free-text kinds (clean: capitalised, numbers)."""
    from bench.classifier import prompts

    data = prompts()
    for kb in (1, 8, 64):
        data[(kb, "hard clean")] = hard_clean_prose(kb)
    res: dict[str, dict[tuple[int, str], tuple[float, float]]] = {}
    for name, cl in classifiers_by_name.items():
        rows = {}
        for key, texts in data.items():
            n = rounds if key[0] < 64 else rounds // 8
            samples = []
            for i in range(n):
                t0 = time.perf_counter_ns()
                cl.classify("pii", [texts[i % len(texts)]])  # type: ignore[attr-defined]
                samples.append((time.perf_counter_ns() - t0) / 1000)
            samples.sort()
            rows[key] = (samples[len(samples) // 2], samples[min(len(samples) - 1, int(0.99 * len(samples)))])
        res[name] = rows
    return res


def _r(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def section(per_kind: int, per_clean: int, seed: int, quick: bool = False) -> tuple[list[str], dict[str, object]]:
    """The report's free-text section (markdown lines) and its headline numbers."""
    from kinference_common.detectors.core import Classifiers
    from kinference_common.detectors.pii import SHAPED_RULES, PiiDetector

    before = Classifiers(detectors=(PiiDetector(rules=SHAPED_RULES),))
    after = Classifiers(detectors=(PiiDetector(),))
    before.warm_up()
    after.warm_up()
    variants = {"before (shaped identifiers only)": before, "after (with free-text rules)": after}
    texts = generate(per_kind, per_clean, seed)
    ev = evaluate(texts, variants)
    lat = latency(variants, rounds=60 if quick else 400)
    a_rows = ev["after (with free-text rules)"]
    b_rows = ev["before (shaped identifiers only)"]
    lines = [
        "## Names, street addresses, dates of birth and ages",
        "",
        f"{len(texts)} texts (seed {seed}): {per_kind} per kind, half with the templates and locales the rules "
        f"were written against (dev: {', '.join(DEV_LOCALES)}), half with other templates and locales never looked "
        f"at while writing them (held-out: {', '.join(HELD_OUT_LOCALES)}); {per_clean} per hard clean kind. "
        "How they are made: `bench/eval_freetext.py`. Found = tagged `pii-confirmed` or `pii-unknown`; "
        "as this kind = a candidate of that kind judged over the marked span. Target >= 0.90 (ages: reported).",
        "",
        "| kind | split | texts | found before | found after | confirmed after | as this kind | target met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    headline: dict[str, object] = {}
    for kind in KINDS:
        tot_n = tot_t = 0
        for split in ("dev", "held-out"):
            a, b = a_rows[f"{kind}/{split}"], b_rows[f"{kind}/{split}"]
            tot_n += a.n
            tot_t += a.tagged
            met = "yes" if a.n and a.tagged / a.n >= 0.90 else "**no**"
            lines.append(f"| {kind} | {split} | {a.n} | {_r(b.tagged, b.n)} | {_r(a.tagged, a.n)} | "
                         f"{_r(a.confirmed, a.n)} | {_r(a.as_kind, a.n)} | {met} |")
        headline[kind] = tot_t / tot_n if tot_n else None
    lines += [
        "",
        "### Hard clean texts",
        "",
        "Share tagged `pii-none` (target >= 0.99 over all clean texts, these included).",
        "",
        "| kind | texts | none before | none after |",
        "| --- | ---: | ---: | ---: |",
    ]
    cn = cb = ca = 0
    for name in (*CLEAN, REAL_CODE):
        a, b = a_rows[f"clean:{name}"], b_rows[f"clean:{name}"]
        cn += a.n
        ca += a.n - a.tagged
        cb += b.n - b.tagged
        lines.append(f"| {name} | {a.n} | {_r(b.n - b.tagged, b.n)} | {_r(a.n - a.tagged, a.n)} |")
    lines.append(f"| **all hard clean** | {cn} | {_r(cb, cn)} | {_r(ca, cn)} |")
    headline["hard_clean_none"] = ca / cn if cn else None
    headline["hard_clean_counts"] = (ca, cn)
    lines += [
        "",
        "### Latency, before and after (in-process, this machine, same run)",
        "",
        "`Classifiers.classify` on `bench.classifier`'s prompts (clean: prose, logs and code; pii: the same with an "
        "e-mail, a phone and a card) and on hard clean text (the kinds above, concatenated). "
        f"{'Quick run: few samples. ' if quick else ''}`make bench-classifier` is the authoritative latency table.",
        "",
        "| size | content | before p50 / p99 (us) | after p50 / p99 (us) |",
        "| ---: | --- | ---: | ---: |",
    ]
    lb, la = lat["before (shaped identifiers only)"], lat["after (with free-text rules)"]
    for key in la:
        (b50, b99), (a50, a99) = lb[key], la[key]
        lines.append(f"| {key[0]} KB | {key[1]} | {b50:.0f} / {b99:.0f} | {a50:.0f} / {a99:.0f} |")
        headline[f"p99_{key[0]}kb_{key[1]}"] = a99
    return lines, headline
