"""Personal data in free text: person names, street addresses, dates of birth, ages.

Context rules, not a model: a cue found by the shared Hyperscan scan (ASCII
keywords, bounded width, so clean text costs no ``re`` work) and a validator
that reads the original text right after (or around) the cue with a Unicode
regular expression. A capitalised word is a name only where the writer said
so: after "my name is" and its European equivalents, after a salutation
("Dear", "Hallo", "Bonjour") that ends at a comma or line break, after a
courtesy title ("Mrs", "Herr", "Mme", "Sig.ra"), in a signature line after a
closing ("Regards,", "Mit freundlichen Grüßen") or after a "Name:" field.
"I'm"/"I am" and "this is" need a first and last name followed by the end of
the phrase. Addresses need a house number next to a street type, in the
order the language writes it (``221B Baker Street``, ``14 Rue des Lilas``,
``Via Roma 12``, ``Hauptstraße 12``, ``Kerkstraat 12a``). A date of birth
needs a label ("DOB", "date of birth", "Geburtsdatum") or "born" with a date
and someone personal nearby (I, my, son, patient...): "Einstein was born on
14 March 1879" stays clean. An age needs "N years old" and a personal marker,
or an "Age:" field.

Verdicts: name with context, address and date of birth are confirmed; an age
alone is unknown (it keeps the prompt local under the usual policy without
claiming it identifies anyone).
"""

from __future__ import annotations

import re

from kinference_common.detectors.core import Verdict
from kinference_common.detectors.patterns import Pattern

NONE, UNKNOWN, CONFIRMED = Verdict.NONE, Verdict.UNKNOWN, Verdict.POSITIVE
#: the entity kinds these rules report (``findings`` of a reply)
ENTITIES = ("person", "address", "dob", "age")

_UP = "A-ZÀ-ÖØ-ÞĀĂĄĆČĎĐĒĘĚĞĪŁŃŇŌŐŒŘŚŞŠŢŤŪŮŰŹŻŽ"
_LO = "a-zß-öø-ÿāăąćčďđēęěğīłńňōőœřśşšţťūůűźżž"
#: one name token: Maria, O'Brien, McDonald, Hans-Jürgen, D'Angelo
_TOK = rf"(?:[{_UP}][’']?)?[{_UP}][{_LO}]+(?:[{_UP}][{_LO}]+)?(?:-[{_UP}][{_LO}]+)?"
_PARTICLE = r"(?:van|von|de|der|den|del|della|di|da|du|des|le|la|dos|das|y|zu|ten|ter|el|al|bin|mac)"
_NAME = rf"{_TOK}(?:[ \t]+(?:{_PARTICLE}[ \t]+){{0,2}}{_TOK}){{0,3}}"

#: capitalised words that follow a cue without being anyone's name
_STOP = frozenset(
    """
    The A An This That These Those It Its I Here There Hi Hello Hey Dear All Team Everyone Everybody
    Sir Madam Madame Sirs Friends Friend Colleagues Colleague Customer Customers Client Support Manager
    Hiring Recruiter Admin Administrator User Users Guest Guests Folks Guys World Reader Readers Mom Dad
    Mum Diary Santa God Lord Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February
    March April May June July August September October November December Not Sorry Looking Trying Using
    Working Going Writing Building Running Getting Having Doing New Just Also So Very Really Happy Glad
    Interested Excited Sure Ready Back Available Able Unable Currently Still Now Today Tomorrow Thanks
    Thank Regards Best Cheers Sincerely Kind Warm Yes No Ok Okay Please Python Java Kotlin Rust Linux
    Windows Mac Docker Kubernetes Google Microsoft Amazon Apple Meta Github Gitlab Slack Chrome Firefox
    Excel Word Outlook Teams Zoom Tesla Netflix Spotify Visual Studio Code Cloud Platform Server Pro Max
    Plus Ultra Mini Air Prime Office Suite Edition Version Release Beta Alpha Build Run Test Tests Deploy
    Install Setup Check Lint Update Create Delete Main Master Default Config Production Staging Service
    Api App Application System Project Bot Assistant Model Data Database Error Warning Info Debug Note
    Update Question Problem Issue Request Hallo Bonjour Salut Hola Ciao Buongiorno Bonsoir Guten Tag
    Morgen Abend Herr Frau Monsieur Mme Mlle Señor Señora Signor Signora Mr Mrs Ms Miss Dr Prof Equipo
    Sehr Geehrte Geehrter Damen Herren Mesdames Messieurs Tutti Todos Allen Alle Allemaal Iedereen
    """.split()
)


def _clean_name(m: re.Match[str] | None, min_tokens: int) -> bool:
    if m is None:
        return False
    toks = [t for t in m.group(0).split() if t[0].isupper()]
    if len(toks) < min_tokens or toks[0] in _STOP:
        return False
    return sum(t in _STOP for t in toks) == 0


def _after(text: str, end: int, width: int = 80) -> str:
    return text[end : end + width]


_SEP = r"[ \t]*(?:[:,-][ \t]*)?(?:\r?\n[ \t]*)?"
_INTRO_RE = re.compile(rf"{_SEP}({_NAME})")
_WEAK_RE = re.compile(rf"[ \t]+({_NAME})(?=[ \t]*(?:[,.;!)\n]|$|and\b|from\b|here\b|speaking\b|calling\b|et\b|und\b|y\b|e\b|en\b|de\b|aus\b))")
_TITLES = r"(?:Mr|Mrs|Ms|Mx|Dr|Prof|Herr|Frau|M|Mme|Mlle|Sr|Sra|Srta|Dhr|Mevr|Sig\.ra|Sig|Dott)"
#: the salutation's name (after an optional title) must end at a comma, colon, "!" or line break
_SALUTE_RE = re.compile(rf"[ \t]*(?:{_TITLES}\.?[ \t]+)?({_NAME})(?=[ \t]*(?:[,!:;\n]|$))")
_TITLE_RE = re.compile(rf"\.?[ \t]+({_NAME})")
_SIGN_RE = re.compile(rf"[ \t]*[,!.]?[ \t]*\r?\n[ \t]*(?:--[ \t]*)?({_NAME})[ \t]*(?=\r?\n|$)")
_SIGNED_RE = re.compile(rf"[ \t]*[,:]?[ \t]*(?:\r?\n[ \t]*)?({_NAME})")


def person_intro(text: str, start: int, end: int) -> Verdict:
    """"my name is X", "je m'appelle X", "ich heiße X", "me llamo X": one token is enough."""
    return CONFIRMED if _clean_name(_INTRO_RE.match(text, end), 1) else NONE


_FIELD_RE = re.compile(rf"[ \t]*({_NAME})[ \t]*(?=[,;|\n]|$)")


def person_field(text: str, start: int, end: int) -> Verdict:
    """"Name: Maria Gonzalez" at a line start: first and last name (YAML ``name: build`` is lower case)."""
    if start > 0 and text[start - 1] not in "\n\r\t ,;(|":
        return NONE
    m = _FIELD_RE.match(text, end)
    # A form's "Name: Bernard" (capitalised label) may hold a first name alone;
    # a YAML or code key is lower case (``name: Release``) and needs two tokens.
    return CONFIRMED if _clean_name(m, 1 if text[start].isupper() else 2) else NONE


_GREETED = re.compile(r"\b(?:hi|hello|hey|hallo|bonjour|salut|hola|ciao|hoi|ol[aá]|good[ \t]+\w+)[ \t]*[,!]?[ \t]*$", re.I)
_INTRO_END = re.compile(r"[ \t]+(?:from|speaking|here|calling|with|of|at)\b|[ \t]*\(")


def person_weak(text: str, start: int, end: int) -> Verdict:
    """"I'm X Y," / "Hi, this is X Y from": two name tokens and the phrase ends there
    ("this is" only at the start of a message, after a greeting, or before "from"/"speaking")."""
    m = _WEAK_RE.match(text, end)
    greeted = _GREETED.search(text, max(0, start - 20), start) is not None
    if not _clean_name(m, 1 if greeted else 2):
        return NONE
    if text[start : start + 4].lower() == "this" and not (
        greeted or _INTRO_END.match(text, m.end())  # type: ignore[union-attr]
    ):
        return NONE
    return CONFIRMED


def person_salutation(text: str, start: int, end: int) -> Verdict:
    """"Dear Maria," / "Hallo Herr Müller," / "Hi John\\n": ends at a comma, colon or line break."""
    return CONFIRMED if _clean_name(_SALUTE_RE.match(text, end), 1) else NONE


_TITLE_END = re.compile(
    r"(?:[ \t]*(?:[,.;:!?)\n]|'s\b|’s\b|$)|[ \t]+(?:and|und|et|e|y|en|from|who|wrote|said|says|called|asked"
    r"|is|was|has|had|will|aus|de|di|van)\b)"
)


def person_title(text: str, start: int, end: int) -> Verdict:
    """"Mrs Gonzalez,", "Herr Müller und", "Mme Dubois": a courtesy title and a surname that ends
    the phrase (or a first and last name); "Mr. House various" is a sentence break, not a name."""
    if start > 0 and (text[start - 1].isalnum()):
        return NONE
    m = _TITLE_RE.match(text, end)
    if not _clean_name(m, 1):
        return NONE
    if len(m.group(1).split()) >= 2 or _TITLE_END.match(text, m.end()):  # type: ignore[union-attr]
        return CONFIRMED
    return NONE


def person_signature(text: str, start: int, end: int) -> Verdict:
    """A closing ("Regards,", "Cordialement,") and then a line holding only a name."""
    if text[start : start + 6].lower() == "signed":
        return CONFIRMED if _clean_name(_SIGNED_RE.match(text, end), 1) else NONE
    return CONFIRMED if _clean_name(_SIGN_RE.match(text, end), 1) else NONE


# -------------------------------------------------------------------- addresses

_SUFFIX_EN = (
    "street|st|avenue|ave|road|rd|lane|ln|drive|dr|boulevard|blvd|court|ct|place|pl|way|terrace|ter"
    "|crescent|cres|close|square|sq|parkway|pkwy|circle|cir|trail|trl|alley|row|mews|grove|gardens"
    "|green|hill|hills|heights|park|walk|view|ridge|crossing|loop|path|pike|plaza|point|run|vista"
    "|meadow|meadows|manor|mill|mills|glen|harbor|harbour|haven|island|junction|key|knoll|lake|lakes"
    "|landing|light|lock|lodge|mission|mount|mountain|orchard|oval|locks|lights|burgs|rue|pass|passage|pine|pines|plain|plains"
    "|port|ports|prairie|ranch|rapids|rest|river|shoal|shore|shores|spring|springs|spur|station|stream"
    "|summit|trace|track|trafficway|tunnel|turnpike|union|valley|viaduct|village|ville|well|wells"
    "|brook|brooks|burg|bypass|camp|canyon|cape|causeway|center|centre|cliff|cliffs|club|common|corner"
    "|corners|course|cove|creek|crest|curve|dale|dam|divide|estate|estates|expressway|extension|falls"
    "|ferry|field|fields|flat|flats|ford|forest|forge|fork|forks|fort|freeway|garden|gateway|inlet"
    "|isle|neck|overpass|radial|ramp|shoals|skyway|squares|streets|throughway|underpass|unions"
    "|valleys|views|villages|walks|wall|ways|roads|drives|courts|lanes|parks|ridges|routes|route"
    "|circles|crossroad|crossroads|bridge|branch|bend|bluff|bluffs|bottom|beach|bayou|arcade|annex"
)
_PREFIX = (
    "rue|avenue|av|boulevard|bd|chemin|all[ée]e|impasse|quai|place|cours|route|square|passage|rond-point"
    "|calle|c/|avenida|avda|plaza|paseo|camino|carrer|carretera|ronda|traves[ií]a|glorieta|rambla|pasaje"
    "|cuesta|cañada|callejón|acceso|bajada|pasadizo|urbanización|vía|ctra"
    "|via|viale|piazza|piazzale|corso|vicolo|largo|contrada|strada|lungomare|rua|travessa|largo|praça|alameda"
    "|ulica|ul|aleja|al"
)
_COMPOUND = (
    "straße|strasse|str|weg|gasse|platz|allee|damm|ufer|ring|chaussee|steig|pfad|markt|hof|berg|graben"
    "|straat|laan|gracht|plein|kade|singel|dreef|steeg|pad|dijk|weg|hof|markt"
)
_HOUSE = r"(?:S/N|s/n|[0-9]{1,5}(?:[ \t]?[A-Za-z](?![A-Za-z]))?(?:[/-][0-9]{1,4}[A-Za-z]?)?)"
_W = rf"[{_UP}{_LO}0-9][{_UP}{_LO}'’.-]*"
#: street types written before the name, capitalised (Italian, Spanish, Portuguese, Polish)
_PREFIX_CAP = (
    "Via|Viale|Piazza|Piazzale|Corso|Vicolo|Largo|Contrada|Strada|Lungomare|Calle|Avenida|Avda|Plaza|Paseo"
    "|Camino|Carrer|Carretera|Ronda|Travesía|Travessa|Glorieta|Rambla|Pasaje|Cuesta|Cañada|Callejón|Acceso"
    "|Bajada|Pasadizo|Urbanización|Vía|Ctra|Rua|Praça|Alameda|Estrada|Ulica|ul|Aleja|Rue|Avenue"
)
_ADDR_PRE_NUM_AFTER = re.compile(
    rf"(?:{_PREFIX_CAP}|C/|Av\.)\.?[ \t]+(?:{_W}[ \t]+){{0,5}}{_W},?[ \t]+(?:n[º°o]\.?[ \t]*)?{_HOUSE}(?![0-9.,:]*[0-9])"
)
_ADDR_COMPOUND = re.compile(
    rf"(?:(?:[{_UP}][{_LO}]+-)+(?i:{_COMPOUND})|[{_UP}][{_LO}]*(?i:{_COMPOUND}))\.?,?[ \t]+{_HOUSE}(?![0-9.,:]*[0-9])(?![ \t]*(?:%|km|m\b|kg|min|h\b|€|euro))"
)
_ADDR_COMPOUND_2W = re.compile(
    rf"[{_UP}][{_LO}]+(?:er|e)?[ \t]+(?:Straße|Strasse|Str|Weg|Gasse|Platz|Allee|Damm|Ring)\.?,?[ \t]+{_HOUSE}(?![0-9.,:]*[0-9])"
)


_ORDINAL = re.compile(r"[0-9]+(?:st|nd|rd|th)\b", re.I)


def _ordinal(s: str) -> bool:
    return bool(_ORDINAL.match(s))


_SUFFIX_SET = frozenset(_SUFFIX_EN.split("|"))
_PREFIX_SET = frozenset(w for w in _PREFIX.replace("[ée]", "é").replace("[ií]", "í").split("|"))
_HEAD = re.compile(rf"{_HOUSE}(?:[ \t]?(?:bis|ter))?,?[ \t]+")
_WORD = re.compile(r"[^ \t\r\n,;()]+")
#: street types that are no common word: "98 Tormay Street last spring" is an address anyway
_STRONG_SUFFIX = frozenset(("street", "avenue", "road", "boulevard", "blvd", "lane", "drive", "terrace", "crescent"))
_UNIT = frozenset(("apt", "apt.", "suite", "unit", "flat", "#", "ste", "ste.", "floor"))


def address_number_first(text: str, start: int, end: int) -> Verdict:
    """``221B Baker Street``, ``14 Rue des Lilas``: the house number, then the street.

    Read word by word (a regex alternation of 200 street types would backtrack over
    every capitalised word after every number): English needs one to four capitalised
    words and then a street type that ends the phrase; French and the like a street
    type right after the number and a name after it."""
    head = _HEAD.match(text, start, start + 16)
    if head is None:
        return NONE
    number = text[start : head.end()].split()[0].rstrip(",")
    if _ordinal(number) or (start > 0 and text[start - 1] in ".,/-"):
        return NONE
    words = []
    for m in _WORD.finditer(text, head.end(), head.end() + 90):
        words.append((m.group(0), m.end()))
        if len(words) == 6:
            break
    if not words:
        return NONE
    first = words[0][0].lower().rstrip(".")
    if first in _PREFIX_SET and len(words) > 1:
        return CONFIRMED
    year_like = len(number) == 4 and number[:2] in ("19", "20")
    for k in range(1, min(5, len(words))):
        if not (words[k - 1][0][:1].isupper() or words[k - 1][0][:1].isdigit()):
            return NONE
        word, stop = words[k]
        if word.lower().rstrip(".") not in _SUFFIX_SET:
            continue
        after = text[stop : stop + 1]
        nxt = words[k + 1][0].lower() if k + 1 < len(words) else ""
        if after in ("", ",", "\n", "\r", ";", ")") or word.endswith("."):  # the street ends the phrase
            return NONE if year_like and after != "," else CONFIRMED
        if nxt in _UNIT or (word.lower() in _STRONG_SUFFIX and not year_like):
            return CONFIRMED
    return NONE


def address_number_after(text: str, start: int, end: int) -> Verdict:
    """``Via Roma 12``, ``Calle de Alcalá, 45``, ``Hauptstraße 12``, ``Kerkstraat 12a``."""
    lo = max(0, start - 40)
    window = text[lo : end + 50]
    for rx in (_ADDR_PRE_NUM_AFTER, _ADDR_COMPOUND, _ADDR_COMPOUND_2W):
        for m in rx.finditer(window):
            if m.start() + lo <= start + 2 and m.end() + lo >= start:
                return CONFIRMED
    return NONE


_US_STATES = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC"
    "|ND|OH|OK|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|AA|AE|AP|AS|GU|MP|PR|VI|FM|MH|PW"
)
_US_CITY_ZIP = re.compile(rf"[{_UP}][{_LO}]+(?:[ \t][{_UP}][{_LO}]+)*,[ \t]+(?:{_US_STATES})[ \t]+[0-9]{{5}}(?:-[0-9]{{4}})?$")


def postcode(text: str, start: int, end: int) -> Verdict:
    """A postal code written the way only postal codes are: a UK postcode (``SW1A 1AA``), a
    Dutch one before its town (``8631 BY Schaijk``), a Canadian one (``K1A 0B1``), or a US
    ZIP after "City, ST". Part of an address: confirmed."""
    raw = text[start:end]
    if re.fullmatch(r"[A-Z]{2}[ \t]+[0-9]{5}(?:-[0-9]{4})?", raw):
        m = _US_CITY_ZIP.search(text, max(0, start - 40), end)
        return CONFIRMED if m is not None else NONE
    if raw[:4].isdigit():  # Dutch or Portuguese: the town must follow
        return CONFIRMED if re.match(rf"[ \t]+[{_UP}][{_LO}]+", text[end : end + 30]) and raw[5:7] not in ("AM", "PM") else NONE
    return CONFIRMED


# --------------------------------------------------------------- dates of birth

_MONTHS = (
    "jan(?:uary|uar|vier|eiro)?|feb(?:ruary|ruar|braio)?|f[ée]vr(?:ier)?|m[aä]r(?:ch|z|s|zo)?|apr(?:il|ile)?|avr(?:il)?"
    "|abr(?:il)?|may|mai|mayo|maggio|mei|jun(?:e|i|io)?|juin|giugno|jul(?:y|i|io)?|juil(?:let)?|luglio"
    "|aug(?:ust|ustus)?|ao[uû]t|ago(?:sto)?|sep(?:t(?:ember|embre)?)?|sett(?:embre)?|oct(?:ober|obre)?|okt(?:ober)?"
    "|ott(?:obre)?|nov(?:ember|embre|iembre)?|dec(?:ember)?|dez(?:ember)?|d[ée]c(?:embre)?|dic(?:iembre|embre)?"
    "|ene(?:ro)?|gen(?:naio)?|enero|febrero|marzo|junio|julio|agosto|septiembre|octubre|noviembre|diciembre"
    "|januari|februari|maart|juni|juli|augustus|oktober"
)
_DATE = re.compile(
    rf"[ \t:,-]*(?:(?:on|am|le|il|el|op|the|den|:)[ \t]+)?(?:"
    r"(?:[0-3]?[0-9][./-][01]?[0-9][./-](?:1[89]|20)?[0-9]{2})"
    r"|(?:(?:1[89]|20)[0-9]{2}-[01][0-9]-[0-3][0-9])"
    rf"|(?:[0-3]?[0-9](?:st|nd|rd|th|er|º)?\.?[ \t]+(?:de[ \t]+|of[ \t]+)?(?i:{_MONTHS})\.?,?[ \t]+(?:de[ \t]+)?(?:1[89]|20)[0-9]{{2}})"
    rf"|(?:(?i:{_MONTHS})\.?[ \t]+[0-3]?[0-9](?:st|nd|rd|th)?,?[ \t]+(?:1[89]|20)[0-9]{{2}})"
    r")",
)
_PERSONAL = re.compile(
    r"\b(?:i|i'm|me|my|we|our|you|your|son|daughter|wife|husband|mother|father|mom|mum|dad|child|kid|baby"
    r"|brother|sister|patient|client|customer|employee|applicant|ich|mein|meine|meiner|sohn|tochter|frau|mann"
    r"|je|j'ai|mon|ma|mes|fils|fille|yo|mi|mis|hijo|hija|tengo|soy|io|mio|mia|figlio|figlia|ho|sono|ik|mijn"
    r"|zoon|dochter|ben|bin|sou|tenho|eu|meu|minha)\b",
    re.I,
)


def dob_label(text: str, start: int, end: int) -> Verdict:
    """"DOB: 03/07/1985", "date of birth 3 July 1985", "Geburtsdatum: 03.07.1985"."""
    return CONFIRMED if _DATE.match(text, end) else NONE


_BORN_YEAR = re.compile(r"[ \t]+(?:in|en|im|a)[ \t]+(?:1[89]|20)[0-9]{2}\b")
_SENTENCE = re.compile(r"[.!?]\s")


def dob_born(text: str, start: int, end: int) -> Verdict:
    """"born (on) 03/07/1985", "born in 1985" with someone personal in the same sentence before it."""
    if (_DATE.match(text, end, end + 60) is None and _BORN_YEAR.match(text, end, end + 12) is None
            and _DATE.search(text, end, end + 40) is None):
        return NONE
    before = _SENTENCE.split(text[max(0, start - 60) : start])[-1]
    return CONFIRMED if _PERSONAL.search(before) else NONE


# --------------------------------------------------------------------- ages

_AGE_NUM = re.compile(r"(?<![0-9.,])([0-9]{1,3})[ \t-]?$")


def age_years(text: str, start: int, end: int) -> Verdict:
    """"I'm 34 years old", "mein Sohn ist 7 Jahre alt", "j'ai 34 ans": a personal marker before it."""
    m = re.match(r"[0-9]{1,3}", text[start:end])
    if m is None or not 0 < int(m.group(0)) < 120:
        return NONE
    before = _SENTENCE.split(text[max(0, start - 50) : start])[-1]
    return UNKNOWN if _PERSONAL.search(before) else NONE


def age_field(text: str, start: int, end: int) -> Verdict:
    """"Age: 34", "aged 34" after a personal marker."""
    m = re.search(r"([0-9]{1,3})$", text[start:end])
    if m is None or not 0 < int(m.group(1)) < 120:
        return NONE
    if text[start:end].lower().startswith("age") and ":" in text[start:end]:
        return UNKNOWN
    before = _SENTENCE.split(text[max(0, start - 50) : start])[-1]
    return UNKNOWN if _PERSONAL.search(before) else NONE


# -------------------------------------------------------------------- patterns
# ASCII cues for the shared scan; a non-ASCII letter is written as _NA: one
# character outside printable ASCII, which is how both engines see it
# (Hyperscan's view has \x1a there, ``re`` the letter itself).

_NA = r"[^ -~\t\r\n]"

#: (entity, rule name, cue pattern, validator)
CUES: tuple[tuple[str, str, Pattern, object], ...] = (
    (
        "person",
        "name_intro",
        Pattern(
            "person_intro",
            r"\b(?:my[ \t]+name[ \t]+is|my[ \t]+name's|my[ \t]+full[ \t]+name[ \t]+is|name[ \t]+is"
            r"|je[ \t]+m'appelle|mon[ \t]+nom[ \t]+est|ich[ \t]+hei(?:ss|" + _NA + r")e|mein[ \t]+name[ \t]+ist"
            r"|me[ \t]+llamo|mi[ \t]+nombre[ \t]+es|mi[ \t]+chiamo|il[ \t]+mio[ \t]+nome[ \t]+" + _NA +
            r"|mijn[ \t]+naam[ \t]+is|ik[ \t]+heet|call[ \t]+me|known[ \t]+as)\b",
            caseless=True,
        ),
        person_intro,
    ),
    (
        "person",
        "name_field",
        Pattern(
            "person_field",
            r"\b(?:full[ \t]+name|name|patient|customer|client|applicant|employee|contact[ \t]+person"
            r"|nom|pr" + _NA + r"nom|nombre|nome|vorname|nachname|naam|account[ \t]+holder|cardholder)[ \t]*:",
            caseless=True,
        ),
        person_field,
    ),
    (
        "person",
        "self_intro",
        Pattern("person_weak", r"\b(?:i'm|i[ \t]+am|this[ \t]+is|je[ \t]+suis|ich[ \t]+bin|soy|sono|ik[ \t]+ben)\b", caseless=True),
        person_weak,
    ),
    (
        "person",
        "salutation",
        Pattern(
            "person_salutation",
            r"(?:\b(?:dear|hi|hello|hey|hallo|liebe|lieber|sehr[ \t]+geehrte[r]?|bonjour|salut|ch" + _NA + r"re?"
            r"|cher|ch" + _NA + r"re|hola|querid[oa]|estimad[oa]|ciao|buongiorno|gentile|car[oa]|beste|geachte"
            r"|good[ \t]+morning|good[ \t]+afternoon|good[ \t]+evening|moin|servus|ol" + _NA + r"))[ \t]",
            caseless=True,
        ),
        person_salutation,
    ),
    (
        "person",
        "title",
        Pattern(
            "person_title",
            r"\b(?:Mr|Mrs|Ms|Mx|Miss|Herr|Frau|Mme|Mlle|Monsieur|Madame|Sr|Sra|Srta|Se" + _NA + r"ora?|Signora?"
            r"|Sig\.ra|Sig|Dott|Dott\.ssa|Dhr|Mevr|Mevrouw|Meneer)\b",
        ),
        person_title,
    ),
    (
        "person",
        "signature",
        Pattern(
            "person_signature",
            r"\b(?:regards|best|thanks|thank[ \t]+you|cheers|sincerely|yours[ \t]+truly|yours|cordially|signed"
            r"|gr(?:u|ue|" + _NA + r")(?:ss|" + _NA + r")en?|gruss|gru" + _NA + r"|cordialement|bien[ \t]+" + _NA + r"[ \t]+vous"
            r"|amicalement|saludos|atentamente|un[ \t]+saludo|cordiali[ \t]+saluti|distinti[ \t]+saluti|saluti"
            r"|groeten|groet|met[ \t]+vriendelijke[ \t]+groet|love|xoxo|best[ \t]+wishes|warmly|abra" + _NA + r"os)\b",
            caseless=True,
        ),
        person_signature,
    ),
    (
        "address",
        "street_number_first",
        Pattern(
            "address_number_first",
            r"\b[0-9]{1,5}[A-Za-z]?(?:[ \t]?(?:bis|ter))?,?[ \t]+(?:[A-Z]|(?i:rue|av|bd|boulevard|chemin|all|impasse"
            r"|quai|place|cours|route|square|passage|rond|calle|via|viale|piazza|corso|rua))",
        ),
        address_number_first,
    ),
    (
        "address",
        "street_number_after",
        Pattern(
            "address_number_after",
            r"(?i:stra(?:ss|" + _NA + r")e|str\.|weg|gasse|platz|allee|damm|ufer|ring|chaussee|markt|straat|laan|gracht|plein|kade"
            r"|singel|dreef|steeg|dijk|hof|pad)[ \t]*,?[ \t]+[0-9]"
            r"|\b(?:Via|Viale|Piazza|Piazzale|Corso|Vicolo|Largo|Calle|Avenida|Avda|Plaza|Paseo|Camino|Carrer|Carretera"
            r"|Ronda|Rua|Travessa|Pra" + _NA + r"a|Alameda|Ulica|ul|Aleja|C/|Av|Pasaje|Cuesta|Ca" + _NA + r"ada"
            r"|Callej" + _NA + r"n|Acceso|Bajada|Pasadizo|Urbanizaci" + _NA + r"n|V" + _NA + r"a|Glorieta|Rambla|Estrada|Avenue|Rue)\b",
        ),
        address_number_after,
    ),
    (
        "address",
        "postcode",
        Pattern(
            "postcode",
            r"\b(?:[A-Z]{1,2}[0-9][A-Z0-9]?[ \t][0-9][ABD-HJLNP-UW-Z]{2}"  # UK
            r"|[ABCEGHJ-NPRSTVXY][0-9][ABCEGHJ-NPRSTV-Z][ \t][0-9][ABCEGHJ-NPRSTV-Z][0-9]"  # CA
            r"|[1-9][0-9]{3}[ \t][A-Z]{2}"  # NL, the town checked after
            r"|[1-9][0-9]{3}-[0-9]{3}"  # PT, the town checked after
            r"|[A-Z]{2}[ \t]+[0-9]{5}(?:-[0-9]{4})?)\b",  # US state + ZIP, the city checked before
        ),
        postcode,
    ),
    (
        "dob",
        "birth_label",
        Pattern(
            "dob_label",
            r"\b(?:d\.?o\.?b\.?|date[ \t]+of[ \t]+birth|birth[ \t]?date|birthday|geburtsdatum|geb\.|geboren[ \t]+am"
            r"|date[ \t]+de[ \t]+naissance|n" + _NA + r"e?[ \t]+le|fecha[ \t]+de[ \t]+nacimiento|data[ \t]+di[ \t]+nascita"
            r"|nat[oa][ \t]+il|geboortedatum|geboren[ \t]+op|nacid[oa][ \t]+el)",
            caseless=True,
        ),
        dob_label,
    ),
    (
        "dob",
        "born_date",
        Pattern("dob_born", r"\b(?:born|geboren|nacid[oa]|nat[oa]|n" + _NA + r"e?)\b", caseless=True),
        dob_born,
    ),
    (
        "age",
        "age_years",
        Pattern(
            "age_years",
            r"\b[0-9]{1,3}[ \t-]?(?:years?[ \t-]+old|year-old|yrs?[ \t]+old|y/o|yo|years[ \t]+of[ \t]+age"
            r"|jahre[ \t]+alt|ans|a" + _NA + r"os|anni|jaar[ \t]+oud|jaar)\b",
            caseless=True,
        ),
        age_years,
    ),
    (
        "age",
        "age_field",
        Pattern("age_field", r"\b(?:age[ \t]*:|aged|age[ \t]+is|alter[ \t]*:|[" + "a" + r"]ge[ \t]*:|edad[ \t]*:|et" + _NA + r"[ \t]*:|leeftijd[ \t]*:)[ \t]*[0-9]{1,3}\b", caseless=True),
        age_field,
    ),
)
