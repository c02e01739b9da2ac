"""Personal data in free text: person names, street addresses, dates of birth, ages.

Context rules, not a model: a cue found by the shared Hyperscan scan (ASCII
keywords, bounded width, so clean text costs no ``re`` work) and a validator
that reads the original text right after (or around) the cue with a Unicode
regular expression. A capitalised word is a name only where the writer said
so: after "my name is" and its European equivalents, after a salutation
("Dear", "Hallo", "Bonjour") that ends at a comma or line break, after a
courtesy title ("Mrs", "Herr", "Mme", "Sig.ra"), in a signature line after a
closing ("Regards,", "Mit freundlichen Grüßen") or after a "Name:" field
(written as JSON or a Python dict too, for keys that name people:
``{"full name": "Maria Gonzalez"}``, ``{"patient": ...}``; a quoted ``name``
or ``customer`` names products and companies as often).
"I'm"/"I am" and "this is" need a first and last name followed by the end of
the phrase. Addresses need a house number next to a street type, in the
order the language writes it (``221B Baker Street``, ``14 Rue des Lilas``,
``Via Roma 12``, ``Hauptstraße 12``, ``Kerkstraat 12a``). A date of birth
needs a label ("DOB", "date of birth", "Geburtsdatum", ``"dob":``; a short
verb may follow it: "my date of birth is 03/07/1985", "birthday is" only
after "my", "his", "Maria's") or "born" with a date and someone personal
nearby (I, my, son, patient...): "Einstein was born on 14 March 1879" stays
clean. An age needs "N years old" and a personal marker,
or an "Age:" field.

Verdicts: name with context, address and date of birth are confirmed; an age
alone is unknown (it keeps the prompt local under the usual policy without
claiming it identifies anyone).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
    None True False Null Nil Undefined NaN Empty Missing Required Optional Unknown Invalid Blank
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
_WEAK_RE = re.compile(rf"[ \t]*({_NAME})(?=[ \t]*(?:[,.;!)\n]|$|and\b|from\b|here\b|speaking\b|calling\b|et\b|und\b|y\b|e\b|en\b|de\b|aus\b))")
_TITLES = r"(?:Mr|Mrs|Ms|Mx|Dr|Prof|Herr|Frau|M|Mme|Mlle|Sr|Sra|Srta|Dhr|Mevr|Sig\.ra|Sig|Dott)"
#: the salutation's name (after an optional title) must end at a comma, colon, "!" or line break
_SALUTE_RE = re.compile(rf"[ \t]*(?:{_TITLES}\.?[ \t]+)?({_NAME})(?=[ \t]*(?:[,!:;\n]|$))")
_TITLE_RE = re.compile(rf"\.?[ \t]+({_NAME})")
#: the cue ends at the first letter of the name's line: the name from there
_SIGN_RE = re.compile(rf"({_NAME})[ \t]*(?=\r?\n|$)")
_SIGNED_RE = re.compile(rf"[ \t]*[,:]?[ \t]*(?:\r?\n[ \t]*)?({_NAME})")


def person_intro(text: str, start: int, end: int) -> Verdict:
    """"my name is X", "je m'appelle X", "ich heiße X", "me llamo X": one token is enough."""
    return CONFIRMED if _clean_name(_INTRO_RE.match(text, end - 1), 1) else NONE


_FIELD_RE = re.compile(rf"[ \t]*({_NAME})[ \t]*(?=[,;|\n}}]|$)")
_QUOTED_FIELD_RE = {q: re.compile(rf"({_NAME})[ \t]*(?={q}|[,;])") for q in "\"'"}


_KEY = re.compile(r"[^\"':]*")
#: quoted keys (JSON, a Python dict) whose value is a person's name no more often than a
#: product's, a project's or a company's
_THINGS_KEYS = frozenset({"name", "customer", "client", "employee", "nom", "nombre", "nome", "naam"})


def person_field(text: str, start: int, end: int) -> Verdict:
    """"Name: Maria Gonzalez" at a line start: first and last name (YAML ``name: build`` is lower case).
    Written as JSON or a Python dict too (``{"full name": "Maria Gonzalez"}``, ``{'patient': ...}``): a quoted
    name ends at its quote; a quoted ``name``, ``customer`` or ``client`` is not read (products, projects)."""
    if start > 0 and text[start - 1] not in "\n\r\t ,;(|{\"'":
        return NONE
    if start > 0 and text[start - 1] in "\"'" and _KEY.match(text, start).group().lower() in _THINGS_KEYS:
        return NONE  # {"name": "Blue Widget"}: a JSON key that names products and companies as often as people
    quote = text[end - 2]
    m = (_QUOTED_FIELD_RE[quote] if quote in "\"'" else _FIELD_RE).match(text, end - 1)
    # A form's "Name: Bernard" (capitalised label) may hold a first name alone;
    # a YAML or code key is lower case (``name: Release``) and needs two tokens.
    return CONFIRMED if _clean_name(m, 1 if text[start].isupper() else 2) else NONE


_GREETED = re.compile(r"\b(?:hi|hello|hey|hallo|bonjour|salut|hola|ciao|hoi|ol[aá]|good[ \t]+\w+)[ \t]*[,!]?[ \t]*$", re.I)
_INTRO_END = re.compile(r"[ \t]+(?:from|speaking|here|calling|with|of|at)\b|[ \t]*\(")


def person_weak(text: str, start: int, end: int) -> Verdict:
    """"I'm X Y," / "Hi, this is X Y from": two name tokens and the phrase ends there
    ("this is" only at the start of a message, after a greeting, or before "from"/"speaking")."""
    m = _WEAK_RE.match(text, end - 1)
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
    return CONFIRMED if _clean_name(_SALUTE_RE.match(text, end - 1), 1) else NONE


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
        return CONFIRMED if _clean_name(_SIGNED_RE.match(text, end - 1), 1) else NONE
    return CONFIRMED if _clean_name(_SIGN_RE.match(text, end - 1), 1) else NONE


# -------------------------------------------------------------------- addresses
# Street types, one list per way of writing them, written from each language's
# usual types (the USPS suffix table for English; the Italian, Spanish,
# Portuguese, French, Polish, German and Dutch usual types), not from a
# generator. The scan's cues are built from the same lists, so a type the
# validator knows can never be missed by its cue.

#: non-ASCII letters in a cue: one character outside printable ASCII (see ``CUES``)
_NA = r"[^ -~\t\r\n]"


def _cue_alt(words: Iterable[str]) -> str:
    """An alternation of ``words`` in the scan's ASCII subset (a non-ASCII letter -> ``_NA``)."""
    out = sorted({"".join(c if c.isascii() else "\x00" for c in re.escape(w)).replace("\x00", _NA) for w in words},
                 key=len, reverse=True)
    return "|".join(out)


def _cue_words(words: Iterable[str]) -> str:
    """Whole words, caseless: ``\b`` after those ending in ASCII; after those ending in a
    non-ASCII letter (``allée``, ``località``), where ``\b`` cannot hold, the next character
    must be no letter or digit."""
    words = set(words)
    ascii_end = {w for w in words if w[-1].isascii()}
    alts = [rf"(?i:{_cue_alt(ascii_end)})\b"]
    if words - ascii_end:
        alts.append(rf"(?i:{_cue_alt(words - ascii_end)})(?:[^A-Za-z0-9_]|$)")
    return "(?:" + "|".join(alts) + ")"


#: English street types written after the name ("221B Baker Street"): USPS Publication 28's
#: suffixes and their usual abbreviations, British ones (close, mews, crescent) and the
#: Australian and New Zealand ones (parade, circuit, quad, pocket) besides; not the ones that
#: are mostly everyday words ("End", "Top", "Steps", "Return"). Everyday words that stay
#: ("Point", "Run", "Well") count only where the street ends the phrase or a unit follows.
_SUFFIX_EN = frozenset("""
    street st avenue ave road rd lane ln drive dr boulevard blvd court ct place pl way terrace ter crescent
    cres close square sq parkway pkwy circle cir trail trl alley aly row mews grove gardens garden gdns green
    hill hills heights hts park walk view ridge crossing xing loop path pike plaza plz point run vista meadow
    meadows manor mill mills glen harbor harbour haven island junction jct key knoll lake lakes landing lock
    lodge mission mount mountain mtn orchard oval rue pass passage pine pines plain plains port prairie ranch
    rapids river shoal shore shores spring springs spur station stream summit trace track trafficway tunnel
    turnpike tpke union valley vly viaduct village vlg ville wells brook brooks burg bypass byp camp canyon cape
    causeway cswy center ctr centre cliff cliffs club common corner corners course cove creek crk crest curve
    dale dam divide estate estates expressway expy extension ext falls ferry field fields flat flats ford forest
    forge fork forks fort freeway fwy gateway highway hwy hollow holw inlet isle neck overpass skyway stravenue
    throughway underpass wall bridge branch bend bluff bluffs bottom beach bayou arcade annex route crossroad
    motorway
    streets avenues roads lanes drives courts places terraces squares parkways circles trails alleys groves
    greens ridges villages valleys manors glens harbors islands knolls junctions lodges mountains
    orchards ports ranches rivers shoals trails tunnels fords forests forges centers crossings crests
    creeks curves estates extensions fields gardens gateways highways hollows inlets meadows pikes
    plazas prairies spurs stations streams summits vistas burgs crossroads light lights locks parks radial ramp
    rest routes unions well
    parade circuit esplanade promenade quay rise chase mall strand broadway laneway ridgeway lookout gap grange
    glade vale wynd boulevarde concourse approach brae link outlook retreat wharf quadrant frontage plateau
    quad quays circlet pocket riviera fairway nook cul-de-sac walkway crossway gully knoll ramble coves
    views keys points walks ways tracks paths loops
""".split())
#: plurals that are how prose counts things ("10 Scenic Views", "3 API Keys"): only with a unit
#: or a town after them ("6340 William Views Apt. 618")
_NEEDS_TAIL = frozenset("views keys points walks ways tracks paths loops lights locks".split())
#: plural suffixes are also how headings count things ("3 Green Mountains"): after a one-digit
#: number they need what follows an address (a unit, or a comma and a postcode or a town)
_PLURAL_EN = frozenset(w for w in _SUFFIX_EN if w.endswith("s") and w[:-1] in _SUFFIX_EN | {"avenue", "place", "terrace", "way", "vista", "estate"})
#: street types that are no common word: "98 Tormay Street last spring" is an address anyway
_STRONG_SUFFIX = frozenset(("street", "avenue", "road", "boulevard", "blvd", "lane", "drive", "terrace", "crescent"))
_UNIT = frozenset(("apt", "apt.", "suite", "unit", "flat", "#", "ste", "ste.", "floor"))

#: street types written before the name: French (after the number: "14 rue des Lilas"; Belgian
#: and Swiss also before it), Spanish, Catalan, Italian, Portuguese, Polish
_TYPES_BEFORE = frozenset("""
    rue avenue boulevard chemin allée impasse quai chaussée faubourg sentier ruelle montée voie
    calle avenida paseo plaza camino carretera ronda travesía vía vial glorieta rambla pasaje cuesta
    cañada callejón acceso bajada subida pasadizo urbanización barrio polígono bulevar alameda senda
    costanilla prolongación muelle carrer passeig plaça avinguda travessera
    via viale piazza piazzale piazzetta corso vicolo vico largo contrada strada stradella stradone lungomare
    lungolago lungarno lungotevere borgo borgata frazione località salita discesa calata traversa rotonda
    galleria passaggio canale fondamenta campiello stretto incrocio circonvallazione
    rua travessa praça estrada beco calçada caminho rotunda praceta bairro ladeira azinhaga
    ulica ul aleja al plac osiedle os
""".split())
#: French types written after the number only ("3 place de la Concorde"): as a first word they
#: are English too ("Place your order", "Route 66")
_TYPES_AFTER_NUMBER = _TYPES_BEFORE | frozenset(
    "place cours route square passage rond-point esplanade promenade cité résidence hameau traverse parvis".split()
)
#: French types that are English words too: after a number they need a particle or a town
_ENGLISH_TOO = frozenset("place square passage route cours promenade esplanade cité traverse".split())
#: abbreviations written with a dot ("Av. da Liberdade, 12"); one letter ones ("C.", "R.") need more
_ABBR = frozenset("c/ av avda c r pza pç tv trav bd ctra urb ul al pl os estr lgo sta".split())
#: lower-case types that are idiomatic in running text ("abito in via Roma 12", "calle Mayor 5")
_LOWER_OK = _TYPES_BEFORE - {"via", "plaza", "largo", "campo", "al", "os", "ul", "vial", "senda", "salita", "stretto"}

#: German and Dutch street types written as the end of one word ("Hauptstraße 12", "Kerkstraat 12a")
_COMPOUND = (
    "straße", "strasse", "str.", "weg", "gasse", "platz", "allee", "damm", "ufer", "chaussee", "steig", "pfad",
    "markt", "hof", "berg", "graben", "gürtel", "kai", "zeile", "stieg", "wall", "promenade", "siedlung", "anger",
    "straat", "laan", "gracht", "plein", "kade", "singel", "dreef", "steeg", "dijk", "baan", "boulevard",
    "plantsoen", "burgwal", "haven", "kanaal", "hoven", "ring", "pad", "lei", "kaai", "vest", "steenweg",
    # Swedish, Danish, Norwegian: "Storgatan 12", "Vesterbrogade 3", "Karl Johans gate 1"
    "gatan", "gata", "vägen", "väg", "gränd", "torget", "stigen", "backen", "gången", "slingan", "gade", "vej",
    "vejen", "stræde", "torv", "veien", "vei",
)
_HOUSE = r"(?:S/N|s/n|[0-9]{1,5}(?:[ \t]?[A-Za-z](?![A-Za-z]))?(?:[/-][0-9]{1,4}[A-Za-z]?)?)"
_HOUSE_RE = re.compile(rf"(?:n[º°o]\.?|nr\.?)?{_HOUSE}")
_ADDR_COMPOUND = re.compile(
    rf"(?:(?:[{_UP}][{_LO}]+-)+(?i:{'|'.join(map(re.escape, _COMPOUND))})|[{_UP}][{_LO}]{{2,}}(?i:{'|'.join(map(re.escape, _COMPOUND))}))"
    rf"\.?,?[ \t]+(?:Nr\.?[ \t]*)?{_HOUSE}(?![0-9.,:]*[0-9])(?![ \t]*(?:%|km|m\b|kg|min|h\b|€|euro|x\b))"
)
_ADDR_COMPOUND_2W = re.compile(
    rf"[{_UP}][{_LO}]+(?:er|e|s)?[ \t]+(?:Straße|Strasse|Str|Weg|Gasse|Platz|Allee|Damm|Ring|Gürtel|Kai|Laan|Plein|gate|vei|väg|vej)"
    rf"\.?,?[ \t]+{_HOUSE}(?![0-9.,:]*[0-9])"
)

_ORDINAL = re.compile(r"[0-9]+(?:st|nd|rd|th)\b", re.I)


def _ordinal(s: str) -> bool:
    return bool(_ORDINAL.match(s))


def _year_like(number: str) -> bool:
    return len(number) == 4 and number[:2] in ("19", "20")


_HEAD = re.compile(rf"{_HOUSE}(?:[ \t]?(?:bis|ter))?,?[ \t]+")
_WORD = re.compile(r"[^ \t\r\n,;()]+")
_PARTICLES = frozenset(
    "de del della dei degli delle di da do dos das du des la le les el los las van von der den ter ten y e i "
    "d' l' dell' d’ l’ dell’ al".split()
)


def _words(text: str, pos: int, limit: int, width: int = 90) -> list[tuple[str, int, int]]:
    out = []
    for m in _WORD.finditer(text, pos, min(len(text), pos + width)):
        out.append((m.group(0), m.start(), m.end()))
        if len(out) == limit:
            break
    return out


def _tail_is_address(text: str, pos: int) -> bool:
    """What follows a street when it is an address: a unit, or a comma and a postcode or a town."""
    m = _TAIL.match(text, pos, pos + 40)
    return m is not None


_UNITS_ALL = (
    r"apt|apt\.|suite|unit|flat|ste|floor|piano|appartamento|app\.?|int\.?|interno|scala|piso|puerta|pta\.?|"
    r"escalera|esc\.?|bajo|dcha\.?|izq(?:da)?\.?|andar|fração|bus|boîte|bte|étage|stiege|stock|top|tür|whg\.?"
)
_TAIL = re.compile(
    rf"[ \t]*(?:(?i:{_UNITS_ALL})[ \t]*[0-9A-Za-z]|,?[ \t]*(?:[A-Z]{{1,2}}-)?[0-9]{{4,5}}(?:-[0-9]{{3}})?[ \t]+[{_UP}]"
    rf"|,[ \t]+[{_UP}][{_LO}]+(?:[ \t,]|$))"
)


_PREV_WORD = re.compile(r"([^ \t\r\n,;:()]+)[ \t]+$")
#: words before a house number that belong to the address ("Unit 4 7 Gordon Lookout")
_UNIT_BEFORE = frozenset("unit flat apt apt. suite ste level lot no no. nr nr. box house".split())


def _after_a_name(text: str, start: int) -> bool:
    """The number follows a capitalised word on its line ("Studio 54", "The 3 Musketeers")."""
    m = _PREV_WORD.search(text, max(0, start - 30), start)
    return m is not None and m.group(1)[:1].isupper() and m.group(1).lower() not in _UNIT_BEFORE


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
    unit_slash = start > 1 and text[start - 1] == "/" and text[start - 2].isdigit()  # "333/478 Dustin Run"
    if _ordinal(number) or (start > 0 and text[start - 1] in ".,/-:" and not unit_slash):  # 3.5, ::1, 12:30
        return NONE
    words = _words(text, head.end(), 6)
    if not words:
        return NONE
    first = words[0][0].lower().rstrip(".")
    if first in _TYPES_AFTER_NUMBER and len(words) > 1:
        if first not in _ENGLISH_TOO:
            return CONFIRMED
        # "3 place de la Concorde", "3 place Vendôme", "3 Place Vendôme, 75001 Paris";
        # not "3 Place Settings", "2 square meters"
        nxt = words[1][0]
        if nxt.lower() in _PARTICLES or nxt.lower() in ("saint", "sainte", "st", "ste") or (
            words[0][0][0].islower() and nxt[0].isupper()
        ) or _tail_is_address(text, words[1][2]):
            return CONFIRMED
        return NONE
    digits = len(number.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
    for k in range(1, min(5, len(words))):
        if not (words[k - 1][0][:1].isupper() or words[k - 1][0][:1].isdigit()):
            return NONE
        word, _s, stop = words[k]
        low = word.lower().rstrip(".")
        if low not in _SUFFIX_EN:
            continue
        nxt = words[k + 1][0].lower() if k + 1 < len(words) else ""
        tail = nxt in _UNIT or _tail_is_address(text, stop)
        if (low in _NEEDS_TAIL or low in _PLURAL_EN and digits < 2) and not tail:
            return NONE
        if (low not in _STRONG_SUFFIX and not tail and _after_a_name(text, start)
                and "," not in text[start : head.end()]):
            return NONE  # "Studio 54 Disco Club", "Formula 1 Grand Prix Circuit": a name's number
        after = text[stop : stop + 1]
        if after in ("", ",", "\n", "\r", ";", ")") or word.endswith("."):  # the street ends the phrase
            return NONE if _year_like(number) and after != "," else CONFIRMED
        if nxt in _UNIT or (low in _STRONG_SUFFIX and not _year_like(number)):
            return CONFIRMED
    return NONE


#: first words that make "<type> <word> <number>" something else ("Strada Route 66", "Via Version 2")
_NOT_A_STREET_NAME = frozenset(
    "route highway interstate exit gate platform terminal level room page chapter step version release windows "
    "season episode part volume round stage phase week day year table figure item game line row column section "
    "python iphone android tier".split()
)
#: what follows "<type> <name> <number>" in English prose that is no address ("Plaza Hotel 5 stars")
_NOT_AFTER_HOUSE = frozenset(
    "was is are were has had have stars times years days hours minutes points people players seasons episodes "
    "chapters games levels goals".split()
)


_TYPE_WORD = re.compile(r"C/|[^\W\d_]+")


def address_type_first(text: str, start: int, end: int) -> Verdict:
    """``Via Roma 12``, ``Calle de Alcalá, 45``, ``Rua de Correia, 978``, ``Av. da Liberdade 12``:
    a street type, one to five words of its name (capitalised, or particles), a house number."""
    tw = _TYPE_WORD.match(text, start)
    if tw is None:
        return NONE
    word = tw.group(0)
    low = word.lower()
    dotted = text[tw.end() : tw.end() + 1] == "."
    if low in _ABBR:
        if not dotted and low not in ("av", "ul", "al", "os", "c/"):
            return NONE
    elif low not in _TYPES_BEFORE:
        return NONE
    if word[0].islower() and not (dotted and low in ("ul", "al", "pl", "os")):  # Polish "ul. Długa 5"
        if low == "via":  # English "via"; Italian writes "in via Roma 12"
            if not text[max(0, start - 3) : start].lower().endswith("in "):
                return NONE
        elif low not in _LOWER_OK:
            return NONE
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "-_./"):
        return NONE
    words = _words(text, tw.end() + dotted, 7)
    names = 0
    comma = False
    for w, ws, we in words:
        if w.endswith(".") and w[:1].isdigit():  # "Borgo Bruno, 68." ends the sentence
            w, we = w[:-1], we - 1
        if _HOUSE_RE.fullmatch(w) and names:
            if w.lower() == "s/n":
                return CONFIRMED
            if _year_like(w):
                return NONE
            nxt = text[we : we + 6]
            if re.match(r"[.,:]?[0-9]|[ \t]*(?:%|km|m\b|kg|min|h\b|€|euro|x\b|gb|mb|ms)", nxt, re.I):
                return NONE
            nw = _WORD.match(text, we + 1, we + 24) if text[we : we + 1] == " " else None
            if nw is not None and nw.group(0) in _NOT_AFTER_HOUSE:
                return NONE
            if len(low) == 1 and not (comma or words[0][0].lower() in _PARTICLES or _tail_is_address(text, we)):
                return NONE  # "C. 3" / "R. Kelly 2": a one-letter abbreviation needs more
            return CONFIRMED
        first = w[:1]
        if w.lower() in _PARTICLES or w.lower().startswith(("d'", "l'", "dell'", "d’", "l’")):
            pass
        elif first.isupper() and not (names == 0 and w.lower() in _NOT_A_STREET_NAME):
            names += 1
        else:
            return NONE
        comma = text[we : we + 1] == ","
    return NONE


def _english_ing(word: str) -> bool:
    """"String", "Spring", "Monitoring", "Rendering": English words that end like a German "-ring"
    street ("Kaiserring", "Hellwigring", "Berit-Siering-Ring")."""
    low = word.lower()
    if "-" in word:
        return False
    if low.endswith("pad"):  # Keypad, Notepad; Dutch "Fietspad" and Flemish "Elkepad" stay
        return low in ("keypad", "notepad", "touchpad", "trackpad", "launchpad", "numpad", "ipad", "gamepad", "scratchpad")
    return low.endswith("ring") and (len(low) < 6 or low[-5] in "aeioutpbs")


def address_compound(text: str, start: int, end: int) -> Verdict:
    """``Hauptstraße 12``, ``Kerkstraat 12a``, ``Marta-Fritsch-Gasse 3-2``, ``Berliner Straße 5``."""
    lo = max(0, start - 40)
    window = text[lo : end + 50]
    for rx in (_ADDR_COMPOUND, _ADDR_COMPOUND_2W):
        for m in rx.finditer(window):
            if m.start() + lo <= start + 2 and m.end() + lo >= start:
                street, house = m.group(0).split(None, 1)[0], m.group(0).rsplit(None, 1)[-1]
                if _year_like(house) or _english_ing(street.rstrip(".,")):
                    return NONE
                return CONFIRMED
    return NONE


_US_STATES = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC"
    "|ND|OH|OK|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|AA|AE|AP|AS|GU|MP|PR|VI|FM|MH|PW"
)
_US_CITY_ZIP = re.compile(rf"[{_UP}][{_LO}]+(?:[ \t][{_UP}][{_LO}]+)*,[ \t]+(?:{_US_STATES})[ \t]+[0-9]{{5}}(?:-[0-9]{{4}})?$")


def postcode(text: str, start: int, end: int) -> Verdict:
    """A postal code written the way only postal codes are: a UK postcode (``SW1A 1AA``), a
    Dutch one before its town (``8631 BY Schaijk``, ``8631BY Schaijk``), a Canadian one
    (``K1A 0B1``), or a US ZIP after "City, ST". Part of an address: confirmed."""
    raw = text[start:end]
    if re.fullmatch(r"[A-Z]{2}[ \t]+[0-9]{5}(?:-[0-9]{4})?", raw):
        m = _US_CITY_ZIP.search(text, max(0, start - 40), end)
        return CONFIRMED if m is not None else NONE
    if raw[:4].isdigit():  # Dutch or Portuguese: the town must follow
        return CONFIRMED if re.match(rf"[ \t]+[{_UP}][{_LO}]+", text[end : end + 30]) and raw[-2:] not in ("AM", "PM") else NONE
    return CONFIRMED


_STREET_END = re.compile(
    rf"(?:^|[ \t(:])((?:[{_UP}][^ \t\r\n,;()]*|(?i:{'|'.join(sorted(_PARTICLES - {'e', 'i', 'y'}))}))"
    rf"(?:[ \t]+(?:[{_UP}][^ \t\r\n,;()]*|(?i:{'|'.join(sorted(_PARTICLES - {'e', 'i', 'y'}))}))){{0,5}}),?[ \t]+({_HOUSE})"
    rf"(?:[ \t]+(?i:{_UNITS_ALL})[ \t]*[0-9A-Za-z]{{1,4}})?[ \t]*$"
)


def street_postcode(text: str, start: int, end: int) -> Verdict:
    """``<street> <number>, <postcode> <Town>`` in any European order: a comma (or line break),
    a postcode and a capitalised town, after a street: capitalised words and a house number
    (``Stretto Elena, 0, 63069 Marcelli``) or a known street type (``rue Boulay, 89874 Pasquier``)."""
    seg = text[max(0, start - 80) : start]
    cut = max(seg.rfind("\n"), seg.rfind(". "), seg.rfind("("), seg.rfind(": "))
    seg = seg[cut + 1 :]
    code = text[start:end].lstrip(",\n \t").split()[0]
    m = _STREET_END.search(seg)
    # Without a street type: two capitalised words at least ("Stretto Elena, 0", not "Python 3"),
    # none of them a counted thing ("Chapter 3"), and no year where the postcode is ("Auto 5, 2013").
    if m is not None and not _year_like(code):
        name, house = m.group(1).split(), m.group(2)
        capitals = sum(w[:1].isupper() for w in name)
        if capitals >= 2 and not any(w.lower() in _NOT_A_STREET_NAME for w in name) and not _year_like(house):
            return CONFIRMED
    for w in seg.replace(",", " ").split()[-7:]:
        lw = w.lower().rstrip(".")
        if lw in _TYPES_AFTER_NUMBER or lw in _SUFFIX_EN - _PLURAL_EN - {"st", "dr", "pl", "ct", "run", "key", "club"} or any(
            lw.endswith(c) and len(lw) > len(c) + 2 for c in _COMPOUND
        ):
            if w[:1].isupper() or lw in _LOWER_OK:
                return CONFIRMED
    return NONE


_LABEL_TYPES = _TYPES_AFTER_NUMBER | _ABBR


def address_label(text: str, start: int, end: int) -> Verdict:
    """"Address: rue de Rousset", "I live at rue Coulon": an address label or "live at" and then a
    street type with a name after it (a number and the rest are found by the other rules)."""
    words = [w for w in _words(text, end, 4, 40) if w[0] != ":"]
    if len(words) < 2:
        return NONE
    w0 = words[0][0].lower().rstrip(".")
    if w0 in _LABEL_TYPES and (words[1][0][:1].isupper() or words[1][0].lower() in _PARTICLES):
        return CONFIRMED
    return NONE


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
    # after the label: a colon, "=", quotes (JSON), a short verb ("is", "was", "ist", "est")
    rf"[ \t:,=\"'-]*(?P<verb>(?:is|was|ist|war|est|es|era|è)[ \t]+)?(?:(?:on|am|le|il|el|op|the|den|:)[ \t]+)?(?:"
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


#: whose birthday it is, just before the word: "my", "his", "Maria's", "my son's"
_OWNER = re.compile(
    r"(?:\b(?i:my|your|his|her|our|their)|\b[A-Z][a-z]+['’]s"
    r"|\b(?i:son|daughter|wife|husband|mother|father|mom|mum|dad|child|kid|baby|brother|sister|patient"
    r"|client|customer)['’]s)[ \t]+$"
)


def dob_label(text: str, start: int, end: int) -> Verdict:
    """"DOB: 03/07/1985", "date of birth 3 July 1985", "Geburtsdatum: 03.07.1985",
    "my date of birth is 03/07/1985", ``"dob": "1985-07-03"``. "birthday is <date>"
    only of someone ("my birthday is 03/07/1985"): "the shop's birthday is ..." is none."""
    m = _DATE.match(text, end)
    if m is None:
        return NONE
    if m.group("verb") and text[start:end].lower().startswith("birthday"):
        return CONFIRMED if _OWNER.search(text, max(0, start - 30), start) else NONE
    return CONFIRMED


_BORN_YEAR = re.compile(r"[ \t]+(?:in|en|im|a)[ \t]+(?:1[89]|20)[0-9]{2}\b")
_SENTENCE = re.compile(r"[.!?]\s")


_LETTERS = re.compile(r"[^\W\d_]+")


def dob_born(text: str, start: int, end: int) -> Verdict:
    """"born (on) 03/07/1985", "born in 1985" with someone personal in the same sentence before it."""
    # Someone personal first: the cheaper test, and the one history questions fail
    # ("Napoleon was born in 1769"), so the date grammar runs only for the few left.
    before = _SENTENCE.split(text[max(0, start - 60) : start])[-1]
    if not _PERSONAL.search(before):
        return NONE
    end = _LETTERS.match(text, start).end()  # type: ignore[union-attr]  # the cue runs on to a digit
    if (_DATE.match(text, end, end + 60) is None and _BORN_YEAR.match(text, end, end + 12) is None
            and _DATE.search(text, end, end + 40) is None):
        return NONE
    return CONFIRMED


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
# (Hyperscan's view has \x1a there, ``re`` the letter itself). Cues are
# bounded (``[ \t]{1,3}``, not ``[ \t]+``): Hyperscan then needs no start-of-
# match tracking, which costs several times more per byte.

#: (entity, rule name, cue pattern, validator)
CUES: tuple[tuple[str, str, Pattern, object], ...] = (
    (
        "person",
        "name_intro",
        Pattern(
            "person_intro",
            r"\b(?i:(?:my[ \t]{1,3}name[ \t]{1,3}is|my[ \t]{1,3}name's|my[ \t]{1,3}full[ \t]{1,3}name[ \t]{1,3}is|name[ \t]{1,3}is"
            r"|je[ \t]{1,3}m'appelle|mon[ \t]{1,3}nom[ \t]{1,3}est|ich[ \t]{1,3}hei(?:ss|" + _NA + r")e|mein[ \t]{1,3}name[ \t]{1,3}ist"
            r"|me[ \t]{1,3}llamo|mi[ \t]{1,3}nombre[ \t]{1,3}es|mi[ \t]{1,3}chiamo|il[ \t]{1,3}mio[ \t]{1,3}nome[ \t]{1,3}" + _NA +
            r"|mijn[ \t]{1,3}naam[ \t]{1,3}is|ik[ \t]{1,3}heet|call[ \t]{1,3}me|known[ \t]{1,3}as))\b"
            # ... and a capital after it: the scan, not Python, drops "my name is not important"
            r"[ \t]{0,3}[:,-]?[ \t]{0,3}(?:\r?\n[ \t]{0,3})?(?:[A-Z]|" + _NA + r")",
        ),
        person_intro,
    ),
    (
        "person",
        "name_field",
        Pattern(
            "person_field",
            r"\b(?i:full[ \t_]{1,3}name|name|patient|customer|client|applicant|employee|contact[ \t]{1,3}person"
            r"|nom|pr" + _NA + r"nom|nombre|nome|vorname|nachname|naam|account[ \t]{1,3}holder|cardholder)"
            # a JSON or Python dict's quoted key and value: {"name": "Maria Gonzalez"}
            r"[\"']?[ \t]{0,3}:[ \t]{0,3}[\"']?(?:[A-Z]|" + _NA + r")",
        ),
        person_field,
    ),
    (
        "person",
        "self_intro",
        Pattern(
            "person_weak",
            r"\b(?i:i'm|i[ \t]{1,3}am|this[ \t]{1,3}is|je[ \t]{1,3}suis|ich[ \t]{1,3}bin|soy|sono|ik[ \t]{1,3}ben)\b[ \t]{1,3}(?:[A-Z]|" + _NA + r")",
        ),
        person_weak,
    ),
    (
        "person",
        "salutation",
        Pattern(
            "person_salutation",
            r"(?:\b(?i:dear|hi|hello|hey|hallo|liebe|lieber|sehr[ \t]{1,3}geehrte[r]?|bonjour|salut|ch" + _NA + r"re?"
            r"|cher|ch" + _NA + r"re|hola|querid[oa]|estimad[oa]|ciao|buongiorno|gentile|car[oa]|beste|geachte"
            r"|good[ \t]{1,3}morning|good[ \t]{1,3}afternoon|good[ \t]{1,3}evening|moin|servus|ol" + _NA + r"))[ \t]{1,3}(?:[A-Z]|" + _NA + r")",
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
            r"\b(?i:regards|best|thanks|thank[ \t]{1,3}you|cheers|sincerely|yours[ \t]{1,3}truly|yours|cordially"
            r"|gr(?:u|ue|" + _NA + r")(?:ss|" + _NA + r")en?|gruss|gru" + _NA + r"|cordialement|bien[ \t]{1,3}" + _NA + r"[ \t]{1,3}vous"
            r"|amicalement|saludos|atentamente|un[ \t]{1,3}saludo|cordiali[ \t]{1,3}saluti|distinti[ \t]{1,3}saluti|saluti"
            r"|groeten|groet|met[ \t]{1,3}vriendelijke[ \t]{1,3}groet|love|xoxo|best[ \t]{1,3}wishes|warmly|abra" + _NA + r"os)\b"
            # then a line break and a capital (the name's line), or "Signed, Maria"
            r"[ \t]{0,3}[,!.]?[ \t]{0,3}\r?\n[ \t]{0,3}(?:--[ \t]{0,3})?(?:[A-Z]|" + _NA + r")"
            r"|\b(?i:signed)[ \t]{0,3}[,:]?[ \t]{0,3}(?:\r?\n[ \t]{0,3})?(?:[A-Z]|" + _NA + r")",
        ),
        person_signature,
    ),
    (
        "address",
        "street_number_first",
        Pattern(
            "address_number_first",
            # a house number, then a street type within four capitalised words ("221B Baker Street"),
            # or a type right after it ("14 rue des Lilas"); the words start with a capital or a digit
            # so that a match never swallows the real address after an unrelated number
            r"\b[0-9]{1,5}[A-Za-z]?(?:[ \t]?(?:bis|ter))?,?[ \t]{1,3}(?:"
            r"(?:(?:[A-Z0-9]|" + _NA + r")[^ \t\r\n,;()]{0,24}[ \t]{1,3}){1,4}(?i:" + _cue_alt(_SUFFIX_EN) + r")\b"
            r"|" + _cue_words(_TYPES_AFTER_NUMBER) + ")",
        ),
        address_number_first,
    ),
    (
        "address",
        "street_type_first",
        Pattern(
            "address_type_first",
            # a street type, then a capital or a particle ("Via Roma", "Rua de Correia", "Av. da")
            # (no \b after the type: the dot or blank that must follow ends the word, "località" too)
            r"\b(?i:" + _cue_alt(_TYPES_BEFORE | _ABBR - {"c/"}) + r")\.?[ \t]{1,3}(?:[A-Z]|" + _NA
            + r"|(?i:d[aeiou]|d[aeiou]l|dell?[aeio]|de[il]|degli|dos|das|du|des|la|le|les|el|los|las|l|d|san|sant[ao]?)[ \t'])"
            r"|\bC/[ \t]{0,2}(?:[A-Z]|" + _NA + r")",
        ),
        address_type_first,
    ),
    (
        "address",
        "street_compound",
        Pattern(
            "address_compound",
            r"(?i:" + _cue_alt((*_COMPOUND, "ring")) + r")[ \t]{0,2},?[ \t]{1,3}(?:Nr\.?[ \t]{0,2})?[0-9]",
        ),
        address_compound,
    ),
    (
        "address",
        "street_postcode",
        Pattern(
            "street_postcode",
            # ", 20121 Milano", ", 6293JQ Beerzerveld", "\n1010 Wien", ", D-10115 Berlin", ", 1000-001 Lisboa"
            r"[,\n][ \t]{0,3}(?:[A-Z]{1,2}-)?(?:[0-9]{5}|[0-9]{2}-[0-9]{3}|[1-9][0-9]{3}(?:[ \t]?[A-Z]{2}|-[0-9]{3})?)[ \t]{1,3}(?:[A-Z]|"
            + _NA + r")",
        ),
        street_postcode,
    ),
    (
        "address",
        "address_label",
        Pattern(
            "address_label",
            r"\b(?:(?:home|postal|mailing|billing|shipping|delivery|street)[ \t]{1,3})?(?:address|adresse|anschrift"
            r"|indirizzo|direcci" + _NA + r"n|adres|endere" + _NA + r"o|morada|domicilio)[ \t]{0,2}:"
            r"|\b(?:i[ \t]{1,3}live|we[ \t]{1,3}live|lives?|living)[ \t]{1,3}(?:at|on)\b|\bship[ \t]{1,3}to\b|\bdeliver[ \t]{1,3}to\b"
            r"|\bsend[ \t]{1,3}(?:it[ \t]{1,3}|them[ \t]{1,3}|this[ \t]{1,3})?to\b"
            r"|\bwohne[ \t]{1,3}(?:in|an)\b|\bj'habite\b|\bvivo[ \t]{1,3}en\b|\babito[ \t]{1,3}in\b|\bwoon[ \t]{1,3}(?:aan|op)\b"
            r"|\bmoro[ \t]{1,3}na\b",
            caseless=True,
        ),
        address_label,
    ),
    (
        "address",
        "postcode",
        Pattern(
            "postcode",
            r"\b(?:[A-Z]{1,2}[0-9][A-Z0-9]?[ \t][0-9][ABD-HJLNP-UW-Z]{2}"  # UK
            r"|[ABCEGHJ-NPRSTVXY][0-9][ABCEGHJ-NPRSTV-Z][ \t][0-9][ABCEGHJ-NPRSTV-Z][0-9]"  # CA
            r"|[1-9][0-9]{3}[ \t]?[A-Z]{2}"  # NL, the town checked after
            r"|[1-9][0-9]{3}-[0-9]{3}"  # PT, the town checked after
            r"|[A-Z]{2}[ \t]{1,3}[0-9]{5}(?:-[0-9]{4})?)\b",  # US state + ZIP, the city checked before
        ),
        postcode,
    ),
    (
        "dob",
        "birth_label",
        Pattern(
            "dob_label",
            r"\b(?:d\.?o\.?b\.?|date[ \t_]{0,3}of[ \t_]{0,3}birth|birth[ \t_]?date|birthday|geburtsdatum|geb\.|geboren[ \t]{1,3}am"
            r"|date[ \t]{1,3}de[ \t]{1,3}naissance|n" + _NA + r"e?[ \t]{1,3}le|fecha[ \t]{1,3}de[ \t]{1,3}nacimiento|data[ \t]{1,3}di[ \t]{1,3}nascita"
            r"|nat[oa][ \t]{1,3}il|geboortedatum|geboren[ \t]{1,3}op|nacid[oa][ \t]{1,3}el)",
            caseless=True,
        ),
        dob_label,
    ),
    (
        "dob",
        "born_date",
        Pattern(
            "dob_born",
            r"\b(?:born|geboren|nacid[oa]|nat[oa]|n" + _NA + r"e?)\b"
            # a digit within three words ("born on the 3rd", "born in 1985"); words, not any
            # forty characters, so that a match never swallows the next "born"
            r"(?:[ \t,]{1,3}[^ \t\n0-9]{1,12}){0,3}[ \t,:]{1,3}[0-9]",
            caseless=True,
        ),
        dob_born,
    ),
    (
        "age",
        "age_years",
        Pattern(
            "age_years",
            r"\b[0-9]{1,3}[ \t-]?(?:years?[ \t-]{1,3}old|year-old|yrs?[ \t]{1,3}old|y/o|yo|years[ \t]{1,3}of[ \t]{1,3}age"
            r"|jahre[ \t]{1,3}alt|ans|a" + _NA + r"os|anni|jaar[ \t]{1,3}oud|jaar)\b",
            caseless=True,
        ),
        age_years,
    ),
    (
        "age",
        "age_field",
        Pattern("age_field", r"\b(?:age[ \t]{0,3}:|aged|age[ \t]{1,3}is|alter[ \t]{0,3}:|[" + "a" + r"]ge[ \t]{0,3}:|edad[ \t]{0,3}:|et" + _NA + r"[ \t]{0,3}:|leeftijd[ \t]{0,3}:)[ \t]{0,3}[0-9]{1,3}\b", caseless=True),
        age_field,
    ),
)
