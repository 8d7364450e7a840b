-- The demo shop's starting rows (run once, on empty tables): 5,000 customers, 200
-- products, 10,000 orders with 1-4 items each.
INSERT INTO public.customers (email, name, country, balance, attributes)
SELECT 'customer' || g || '@example.com', 'Customer ' || g,
       (ARRAY['NL', 'DE', 'FR', 'GB', 'US'])[1 + g % 5], (g * 7.31) % 1000,
       jsonb_build_object('tier', (ARRAY['gold', 'silver', 'bronze'])[1 + g % 3])
FROM generate_series(1, 5000) g;

INSERT INTO public.products (sku, name, description, price, tags, attributes, in_stock)
SELECT 'SKU-' || lpad(g::text, 5, '0'),
       (ARRAY['Walnut', 'Granite', 'Linen', 'Copper', 'Cedar'])[1 + g % 5] || ' '
           || (ARRAY['lamp', 'chair', 'mug', 'notebook', 'kettle', 'scarf'])[1 + g % 6] || ' ' || g,
       'A sturdy, handmade item (' || g || ') for everyday use',
       round((5 + (g * 13.37) % 250)::numeric, 2),
       ARRAY[(ARRAY['home', 'office', 'kitchen', 'gift'])[1 + g % 4], (ARRAY['new', 'sale', 'classic'])[1 + g % 3]],
       jsonb_build_object('weight_g', 100 + g % 900, 'color', (ARRAY['red', 'black', 'white'])[1 + g % 3]),
       g % 50
FROM generate_series(1, 200) g;

INSERT INTO public.orders (customer_id, status, placed_at)
SELECT 1 + (g * 7919) % 5000,
       (ARRAY['new', 'paid', 'shipped', 'delivered', 'cancelled']::public.order_status[])[1 + g % 5],
       now() - (g || ' minutes')::interval
FROM generate_series(1, 10000) g;

INSERT INTO public.order_items (order_id, line, product_id, quantity, unit_price)
SELECT o.id, l, p.id, 1 + (o.id + l) % 3, p.price
FROM public.orders o
CROSS JOIN LATERAL generate_series(1, 1 + o.id::int % 4) l
JOIN public.products p ON p.id = 1 + (o.id * 31 + l * 17) % 200;

UPDATE public.orders o SET total = s.total
FROM (SELECT order_id, sum(quantity * unit_price) AS total FROM public.order_items GROUP BY order_id) s
WHERE s.order_id = o.id;

ANALYZE public.customers, public.products, public.orders, public.order_items;
