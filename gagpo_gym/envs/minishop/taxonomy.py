"""What the generated catalog sells: WebShop's five categories, ten product types each, as a readable table.

Format: ``[category] Root name`` starts a category, followed by its ``common:`` features (any product of the
category may have them) and name ``descriptors:``. ``type: query | name noun | min-max price`` starts a product
type; its indented lines give the category ``path:`` below the root, its options (``size:``, ``color:``,
``scent:``, ``flavor name:``, ``style:``) and its ``features:``. Lists are ``;``-separated (a key may repeat to
continue a list), and ``$name`` expands one of :data:`SHARED_VALUES`.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED_VALUES: dict[str, tuple[str, ...]] = {
    "colors": ("black", "white", "gray", "navy blue", "red", "pink", "green", "beige", "brown", "purple"),
    "more_colors": ("light blue", "dark green", "khaki", "burgundy", "olive", "ivory", "teal", "coral", "charcoal"),
    "apparel_sizes": ("x-small", "small", "medium", "large", "x-large", "xx-large"),
    "shoe_sizes": ("6", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12"),
}


@dataclass(frozen=True)
class ProductType:
    """One kind of product: the query it is filed under, its category path, name noun, options and price range."""

    query: str
    noun: str
    price: tuple[float, float]
    path: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    features: tuple[str, ...]


@dataclass(frozen=True)
class Category:
    name: str
    root: str
    common: tuple[str, ...]
    descriptors: tuple[str, ...]
    types: tuple[ProductType, ...]


TABLE = """
[beauty] Beauty & Personal Care
common: paraben free; cruelty free; vegan formula; travel size; dermatologist tested; natural ingredients
descriptors: Professional; Organic; Daily; Advanced; Gentle; Salon
type: hair oil | Hair Oil | 8-35
  path: Hair Care > Styling Products > Hair Oils
  size: 1 fl oz; 2 fl oz; 4 fl oz; 8 fl oz
  features: argan oil; dry hair; damaged hair; frizz control; heat protection; hair growth; shine boost
  features: split ends
type: shampoo | Shampoo | 6-30
  path: Hair Care > Shampoo & Conditioner > Shampoos
  size: 8.5 fl oz; 12 fl oz; 16.9 fl oz; 33.8 fl oz
  features: sulfate free; color treated hair; dandruff treatment; volumizing; tea tree oil; dry scalp
  features: keratin; biotin
type: face moisturizer | Face Moisturizer | 10-60
  path: Skin Care > Face > Creams & Moisturizers
  size: 1 oz; 1.7 oz; 2.5 oz; 3.4 oz
  features: hyaluronic acid; sensitive skin; anti aging; fine lines; oily skin; spf 30; non comedogenic
  features: vitamin c
type: lipstick | Lipstick | 5-25
  path: Makeup > Lips > Lipstick
  color: ruby red; nude pink; berry; coral; mauve; plum; classic red; rose
  features: long lasting; matte finish; moisturizing; waterproof; highly pigmented; vitamin e; smudge proof
  features: creamy texture
type: nail polish | Nail Polish | 5-30
  path: Foot, Hand & Nail Care > Nail Art & Polish > Nail Polish
  color: cherry red; baby pink; lilac; navy; nude; gold glitter; black; white
  size: 0.5 fl oz; 0.5 fl oz (pack of 2); 0.5 fl oz (pack of 6)
  features: quick drying; gel finish; chip resistant; non toxic; high gloss; nail art; long wear
type: makeup brush set | Makeup Brush Set | 9-40
  path: Tools & Accessories > Makeup Brushes & Tools > Brush Sets
  color: rose gold; black; pink; white; champagne
  size: 8 pieces; 12 pieces; 16 pieces
  features: synthetic bristles; travel case; foundation brush; eye shadow; easy to clean; soft bristles
  features: blending brush; storage bag
type: deodorant | Deodorant | 6-25
  path: Personal Care > Deodorants & Antiperspirants > Deodorants
  scent: lavender; citrus; unscented; coconut; eucalyptus; cedar wood
  size: 2.6 oz; 3 oz; 3 oz (pack of 2)
  features: aluminum free; baking soda free; sensitive skin; 24 hour protection; odor protection
  features: natural deodorant; stick applicator
type: body wash | Body Wash | 5-25
  path: Personal Care > Bath & Bathing Accessories > Body Washes
  scent: lavender; vanilla; fresh citrus; coconut; mint; honey almond
  size: 12 fl oz; 16 fl oz; 22 fl oz; 32 fl oz
  features: moisturizing; shea butter; sensitive skin; soap free; essential oils; exfoliating
  features: dry skin relief
type: eye cream | Eye Cream | 10-50
  path: Skin Care > Eyes > Creams
  size: 0.5 oz; 1 oz; 1.7 oz
  features: dark circles; puffiness; anti wrinkle; retinol; caffeine; collagen; peptide complex
  features: sensitive skin
type: hair dryer | Hair Dryer | 20-120
  path: Hair Care > Styling Tools & Appliances > Hair Dryers
  color: black; pink; white; rose gold; purple
  features: ionic technology; fast drying; diffuser attachment; low noise; foldable handle
  features: ceramic tourmaline; cool shot button; lightweight design

[grocery] Grocery & Gourmet Food
common: gluten free; non gmo; usda organic; kosher; low calorie; individually wrapped; keto friendly
common: plant based; low sodium
descriptors: Classic; Gourmet; Farmhouse; Artisan; Everyday; Premium
type: protein bar | Protein Bar | 15-45
  path: Snack Foods > Bars > Protein Bars
  flavor name: chocolate chip; peanut butter; cookie dough; salted caramel; birthday cake; mint chocolate
  size: 12 count; 24 count; 12 count (pack of 2)
  features: whey protein; low sugar; dietary fiber; soy free; no artificial sweeteners; nut free
  features: energy boost
type: ground coffee | Ground Coffee | 8-35
  path: Beverages > Coffee, Tea & Cocoa > Coffee > Ground Coffee
  flavor name: medium roast; dark roast; french vanilla; hazelnut; breakfast blend; colombian
  size: 12 ounce; 24 ounce; 2 pound
  features: fair trade; arabica beans; rich flavor; small batch roasted; decaffeinated; smooth taste
  features: resealable bag
type: herbal tea | Herbal Tea | 5-30
  path: Beverages > Coffee, Tea & Cocoa > Tea > Herbal
  flavor name: chamomile; peppermint; ginger lemon; hibiscus; rooibos; lavender
  size: 20 count; 40 count; 20 count (pack of 6)
  features: caffeine free; tea bags; loose leaf; sleep support; digestive health; immune support
  features: compostable bags
type: beef jerky | Beef Jerky | 8-45
  path: Meat & Seafood > Jerky & Dried Meats > Beef Jerky
  flavor name: original; teriyaki; peppered; sweet and spicy; smoked
  size: 2.5 ounce; 8 ounce; 10 ounce (pack of 4)
  features: grass fed; high protein; low fat; no preservatives; nitrate free; zero sugar; resealable bag
type: trail mix | Trail Mix | 6-35
  path: Snack Foods > Trail Mix
  flavor name: dark chocolate; tropical fruit; classic nut; cranberry almond; honey roasted
  size: 8 ounce; 1 pound; 1.5 ounce (pack of 24)
  features: roasted nuts; dried fruit; no added sugar; heart healthy; vegan snack; resealable bag
  features: whole grain
type: olive oil | Extra Virgin Olive Oil | 8-45
  path: Pantry Staples > Cooking Oils > Olive Oils
  size: 16.9 fl oz; 25.3 fl oz; 33.8 fl oz; 1 gallon
  features: cold pressed; first cold extraction; single origin; dark glass bottle; rich in polyphenols
  features: imported from italy; mild flavor
type: hot sauce | Hot Sauce | 5-30
  path: Pantry Staples > Condiments & Salad Dressings > Hot Sauce
  flavor name: habanero; chipotle; garlic; ghost pepper; jalapeno; sriracha
  size: 5 fl oz; 5 fl oz (pack of 3); 12 fl oz
  features: small batch; extra hot; no sugar added; vinegar based; all natural; fermented peppers
type: gummy candy | Gummy Candy | 5-30
  path: Snack Foods > Candy & Chocolate > Gummy Candy
  flavor name: sour watermelon; cherry; mixed fruit; peach rings; blue raspberry
  size: 5 ounce; 2 pound; 1 ounce (pack of 12)
  features: fat free; natural colors; party favors; halal; real fruit juice; bulk candy
type: raw honey | Raw Honey | 8-50
  path: Pantry Staples > Jams, Jellies & Sweet Spreads > Honey
  size: 12 ounce; 16 ounce; 32 ounce; 5 pound
  features: raw unfiltered; unpasteurized; local beekeepers; manuka; squeeze bottle; pure sweetener
type: almond butter | Almond Butter | 8-35
  path: Pantry Staples > Nut & Seed Butters > Almond Butter
  flavor name: creamy; crunchy; vanilla; maple
  size: 12 ounce; 16 ounce; 16 ounce (pack of 2)
  features: no palm oil; dry roasted almonds; no stir; paleo friendly; unsalted; single ingredient

[fashion] Clothing, Shoes & Jewelry
common: machine wash; hand wash; regular fit; relaxed fit; slim fit; long sleeve; soft fabric; cotton blend
descriptors: Classic; Casual; Everyday; Vintage; Essential; Outdoor
type: men's running shoes | Men's Running Shoes | 30-120
  path: Men > Shoes > Athletic > Running
  color: $colors
  size: $shoe_sizes
  features: rubber sole; lace up; breathable mesh; arch support; non slip; cushioned insole
  features: lightweight design; memory foam
type: women's summer dress | Women's Summer Dress | 18-60
  path: Women > Clothing > Dresses > Casual
  color: $colors; $more_colors
  size: $apparel_sizes
  features: v neck; polyester spandex; elastic waist; loose fit; floral print; side pockets; midi length
  features: button closure
type: men's t-shirt | Men's T-Shirt | 8-30
  path: Men > Clothing > Shirts > T-Shirts
  color: $colors; $more_colors
  size: $apparel_sizes
  features: crew neck; pure cotton; moisture wicking; tagless; graphic print; athletic fit; pre shrunk
type: women's leggings | Women's Leggings | 12-45
  path: Women > Clothing > Active > Leggings
  color: $colors; $more_colors
  size: $apparel_sizes
  features: high waist; tummy control; squat proof; four way stretch; yoga pants; side pockets; butt lift
type: men's jeans | Men's Jeans | 25-80
  path: Men > Clothing > Jeans
  color: light wash; dark wash; black; medium blue; stone wash; gray
  size: 30w x 30l; 32w x 30l; 32w x 32l; 34w x 32l; 36w x 32l; 38w x 34l
  features: straight leg; stretch denim; zipper fly; five pocket; classic fit; relaxed leg
type: pullover hoodie | Pullover Hoodie | 20-60
  path: Men > Clothing > Fashion Hoodies & Sweatshirts
  color: $colors; $more_colors
  size: $apparel_sizes
  features: fleece lined; kangaroo pocket; drawstring hood; ribbed cuffs; heavyweight; warm
type: women's sandals | Women's Sandals | 15-60
  path: Women > Shoes > Sandals > Flat Sandals
  color: $colors
  size: 5; 6; 6.5; 7; 7.5; 8; 8.5; 9; 10
  features: open toe; ankle strap; arch support; memory foam; non slip; faux leather; adjustable buckle
type: baseball cap | Baseball Cap | 8-30
  path: Men > Accessories > Hats & Caps > Baseball Caps
  color: $colors; $more_colors
  size: one size; small-medium; large-x-large
  features: adjustable strap; embroidered logo; cotton twill; sun protection; unstructured; curved brim
type: women's winter jacket | Women's Winter Jacket | 45-160
  path: Women > Clothing > Coats, Jackets & Vests > Parkas
  color: $colors; $more_colors
  size: $apparel_sizes
  features: water resistant; detachable hood; zip pockets; faux fur trim; windproof; quilted; packable
type: wool socks | Wool Socks | 10-35
  path: Men > Clothing > Socks > Casual Socks
  color: $colors
  size: medium; large; x-large
  features: merino wool; cushioned sole; moisture wicking; odor resistant; crew length; thermal
  features: hiking socks

[electronics] Electronics
common: easy install; fast charging; high speed; plug and play; durable design; compact size; usb c
descriptors: Pro; Ultra; Smart; Max; Lite; Plus
type: wireless earbuds | Wireless Earbuds | 20-150
  path: Headphones, Earbuds & Accessories > Earbud Headphones
  color: black; white; navy blue; pink; green
  features: noise cancelling; bluetooth 5.3; long battery life; charging case; water resistant
  features: built in microphone; touch control; deep bass
type: phone case | Phone Case | 8-30
  path: Cell Phones & Accessories > Cases, Holsters & Sleeves > Basic Cases
  color: $colors; clear
  style: iphone 13; iphone 14; iphone 15 pro; galaxy s23; pixel 8
  features: shockproof; slim fit; wireless charging compatible; raised edges; kickstand; clear back
  features: drop protection
type: usb c cable | USB C Cable | 6-25
  path: Computers & Accessories > Cables & Accessories > USB Cables
  color: black; white; gray; red
  size: 3 ft; 6 ft; 10 ft; 6 ft (2 pack)
  features: nylon braided; data transfer; 60w power delivery; tangle free; durable connector
  features: aluminum housing
type: hdmi cable | HDMI Cable | 6-30
  path: Television & Video > Accessories > Cables > HDMI Cables
  size: 3 ft; 6 ft; 10 ft; 15 ft; 25 ft
  features: 4k 60hz; gold plated; ethernet channel; hdr support; braided cord; ultra hd
type: portable charger | Portable Charger | 15-60
  path: Cell Phones & Accessories > Chargers & Power Adapters > Power Banks
  color: black; white; blue; pink
  size: 10000mah; 20000mah; 26800mah
  features: dual usb; led display; airline approved; multiple devices; power bank; battery pack
type: bluetooth speaker | Bluetooth Speaker | 20-120
  path: Portable Audio & Video > Portable Speakers & Docks
  color: black; blue; red; gray; teal
  features: waterproof; stereo sound; long battery life; built in microphone; outdoor use; deep bass
  features: party lights
type: wireless mouse | Wireless Mouse | 8-40
  path: Computers & Accessories > Keyboards, Mice & Accessories > Mice
  color: black; white; gray; pink; blue
  features: ergonomic design; silent click; usb receiver; adjustable dpi; long battery life; rechargeable
type: smart watch band | Smart Watch Band | 6-25
  path: Wearable Technology > Accessories > Smartwatch Bands
  color: $colors
  size: 38mm; 41mm; 45mm; 49mm
  features: silicone; sport band; quick release; stainless steel; breathable; adjustable length
type: tv wall mount | TV Wall Mount | 18-90
  path: Television & Video > Accessories > TV Mounts > TV Wall Mounts
  size: 26-55 inch; 32-65 inch; 42-85 inch
  features: full motion; tilt swivel; heavy duty; vesa compatible; cable management; articulating arm
type: security camera | Security Camera | 25-160
  path: Camera & Photo > Video Surveillance > Surveillance Cameras
  color: white; black
  size: 1 camera; 2 cameras; 4 cameras
  features: night vision; motion detection; two way audio; 1080p hd; cloud storage; weatherproof; wifi

[furniture] Home & Kitchen
common: easy assemble; living room; bedroom; space saving; storage space; modern design
common: sturdy construction; mid century
descriptors: Modern; Rustic; Classic; Minimalist; Farmhouse; Industrial
type: office chair | Office Chair | 60-300
  path: Furniture > Home Office Furniture > Home Office Chairs
  color: black; gray; white; brown; blue
  features: lumbar support; height adjustable; mesh back; swivel wheels; padded armrests; high back
  features: ergonomic; tilt lock
type: bookshelf | Bookshelf | 35-180
  path: Furniture > Home Office Furniture > Bookcases
  color: white; black; walnut; rustic brown; oak
  size: 3 tier; 4 tier; 5 tier
  features: solid wood; metal frame; open shelf; wall anchor; industrial style; adjustable shelves
type: coffee table | Coffee Table | 50-250
  path: Furniture > Living Room Furniture > Tables > Coffee Tables
  color: walnut; black; white; natural; espresso; gray
  features: lift top; tempered glass; hidden storage; solid wood legs; round shape; farmhouse style
type: bar stool | Bar Stool | 40-200
  path: Furniture > Kitchen & Dining Room Furniture > Stools > Barstools
  color: black; gray; brown; white; green
  size: 24 inch; 26 inch; 30 inch
  features: swivel seat; faux leather; footrest; back support; adjustable height; metal legs
type: tv stand | TV Stand | 60-300
  path: Furniture > Living Room Furniture > TV & Media Furniture
  color: black; white; walnut; rustic oak; gray
  size: 55 inch; 65 inch; 70 inch
  features: cable management; storage cabinets; led lights; engineered wood; open shelves
  features: sliding barn door
type: nightstand | Nightstand | 30-150
  path: Furniture > Bedroom Furniture > Nightstands
  color: white; black; natural; gray; walnut
  size: 1 pack; set of 2
  features: charging station; two drawers; usb ports; open shelf; small spaces; solid wood
type: storage ottoman | Storage Ottoman | 25-130
  path: Furniture > Living Room Furniture > Ottomans
  color: gray; beige; navy blue; green; pink
  size: small; medium; large
  features: velvet fabric; foldable; footrest; hidden storage; tufted; padded seat
type: shoe rack | Shoe Rack | 15-80
  path: Storage & Organization > Shoe Organizers > Free Standing Shoe Racks
  color: black; white; bamboo; gray
  size: 3 tier; 4 tier; 6 tier; 10 tier
  features: stackable; entryway; metal frame; bamboo wood; tool free assembly; non woven fabric
type: throw pillow covers | Throw Pillow Covers | 8-35
  path: Home Decor Products > Decorative Pillows > Throw Pillow Covers
  color: beige; gray; navy blue; sage green; mustard yellow; terracotta
  size: 16x16 inch; 18x18 inch; 20x20 inch
  features: set of 2; hidden zipper; soft velvet; linen blend; boho style; machine washable
type: area rug | Area Rug | 30-220
  path: Home Decor Products > Rugs, Pads & Protectors > Area Rugs
  color: gray; cream; blue; multicolor; beige; red
  size: 3x5 ft; 5x7 ft; 8x10 ft; 2x6 ft runner
  features: non shedding; stain resistant; washable; low pile; non slip backing; pet friendly
"""


def _values(text: str) -> list[str]:
    out: list[str] = []
    for item in (x.strip() for x in text.split(";")):
        out.extend(SHARED_VALUES[item[1:]] if item.startswith("$") else [item])
    return out


def parse_table(table: str = TABLE) -> tuple[Category, ...]:
    """The categories described by ``table`` (see the module docstring for the format)."""
    categories: list[dict] = []
    for raw in table.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("["):
            name, root = line[1:].split("]", 1)
            categories.append({"name": name, "root": root.strip(), "common": [], "descriptors": [], "types": []})
            continue
        key, value = (x.strip() for x in line.split(":", 1))
        category = categories[-1]
        if key == "type":
            query, noun, price = (x.strip() for x in value.split("|"))
            low, high = (float(x) for x in price.split("-"))
            category["types"].append({"query": query, "noun": noun, "price": (low, high), "options": {},
                                      "features": [], "path": ()})  # fmt: skip
        elif not raw.startswith(" "):
            category[key].extend(_values(value))
        elif key == "path":
            category["types"][-1]["path"] = tuple(x.strip() for x in value.split(">"))
        elif key == "features":
            category["types"][-1]["features"].extend(_values(value))
        else:
            category["types"][-1]["options"].setdefault(key, []).extend(_values(value))
    return tuple(
        Category(
            c["name"],
            c["root"],
            tuple(c["common"]),
            tuple(c["descriptors"]),
            tuple(
                ProductType(
                    t["query"],
                    t["noun"],
                    t["price"],
                    t["path"],
                    {k: tuple(v) for k, v in t["options"].items()},
                    tuple(t["features"]),
                )  # fmt: skip
                for t in c["types"]
            ),
        )
        for c in categories
    )


CATEGORIES: tuple[Category, ...] = parse_table()
