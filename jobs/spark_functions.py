"""Every function of Spark's registry, classified for replays.

A replay, a rebuild or a backfill recomputes a batch with another query, maybe on
another day: an expression may only call what gives one answer per record for ever.
``sql_text`` refuses by name what cannot (``NOT_REPLAYABLE``, ``OUTSIDE_SQL``),
Spark's analysed tree what reads the clock or the session whatever the spelling
(``CLOCK_OR_SESSION``), and its plan what is not one value per record
(``NOT_PER_RECORD``: aggregates, window functions, generators, table functions).
``PER_RECORD`` is what was reviewed as safe. A function in none of them (one a
newer Spark added) is refused until it is classified here: ``tests/integration/
test_sql_pipelines.py`` lists Spark's registry and fails on such a function.
"""

from __future__ import annotations

from jobs import sql_text


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Reviewed: the answer depends on the arguments alone (and the pinned SQL settings,
# ``jobs/streaming/sql_settings.py``).
PER_RECORD = _names(
    """
! != % & * + - / < << <= <=> <> = == > >= >> >>> ^ abs acos acosh add_months
aes_decrypt aggregate and approx_top_k_estimate array array_append array_compact
array_contains array_distinct array_except array_insert array_intersect array_join
array_max array_min array_position array_prepend array_remove array_repeat
array_size array_sort array_union arrays_overlap arrays_zip ascii asin asinh
assert_true atan atan2 atanh base64 between bigint bin binary bit_count bit_get
bit_length bitmap_bit_position bitmap_bucket_number bitmap_count boolean bround
btrim cardinality case cast cbrt ceil ceiling char char_length character_length chr
coalesce collate collation concat concat_ws contains conv convert_timezone cos cosh
cot crc32 csc date date_add date_diff date_format date_from_unix_date date_part
date_sub date_trunc dateadd datediff datepart day dayname dayofmonth dayofweek
dayofyear decimal decode degrees div double e element_at elt encode endswith
equal_null exists exp expm1 extract factorial filter find_in_set flatten float floor
forall format_number format_string from_avro from_csv from_json from_protobuf
from_unixtime from_utc_timestamp from_xml get get_json_object getbit greatest hash
hex hll_sketch_estimate hll_union hour hypot if ifnull ilike in initcap instr int
is_valid_utf8 is_valid_variant is_variant_null isnan isnotnull isnull
json_array_length json_object_keys kll_sketch_get_n_bigint kll_sketch_get_n_double
kll_sketch_get_n_float kll_sketch_get_quantile_bigint kll_sketch_get_quantile_double
kll_sketch_get_quantile_float kll_sketch_get_rank_bigint kll_sketch_get_rank_double
kll_sketch_get_rank_float kll_sketch_merge_bigint kll_sketch_merge_double
kll_sketch_merge_float kll_sketch_to_string_bigint kll_sketch_to_string_double
kll_sketch_to_string_float last_day lcase least left len length levenshtein like ln
locate log log10 log1p log2 lower lpad ltrim luhn_check make_date make_dt_interval
make_interval make_time make_timestamp make_timestamp_ltz make_timestamp_ntz
make_valid_utf8 make_ym_interval map map_concat map_contains_key map_entries
map_filter map_from_arrays map_from_entries map_keys map_values map_zip_with mask
md5 minute mod month monthname months_between named_struct nanvl negative next_day
not nullif nullifzero nvl nvl2 octet_length or overlay parse_json parse_url pi pmod
position positive pow power printf quarter quote radians raise_error reduce regexp
regexp_count regexp_extract regexp_extract_all regexp_instr regexp_like
regexp_replace regexp_substr repeat replace reverse right rint rlike round rpad
rtrim schema_of_avro schema_of_csv schema_of_json schema_of_variant schema_of_xml
sec second sentences sequence sha sha1 sha2 shiftleft shiftright shiftrightunsigned
sign signum sin sinh size slice smallint sort_array soundex space split split_part
sqrt st_asbinary st_geogfromwkb st_geomfromwkb st_setsrid st_srid startswith
str_to_map string struct substr substring substring_index tan tanh theta_difference
theta_intersection theta_sketch_estimate theta_union time time_bucket time_diff
time_from_micros time_from_millis time_from_seconds time_to_micros time_to_millis
time_to_seconds time_trunc timestamp timestamp_micros timestamp_millis
timestamp_seconds tinyint to_avro to_binary to_char to_csv to_date to_json to_number
to_protobuf to_time to_timestamp to_timestamp_ltz to_timestamp_ntz to_unix_timestamp
to_utc_timestamp to_varchar to_variant_object to_xml transform transform_keys
transform_values translate trim trunc try_add try_aes_decrypt try_divide
try_element_at try_make_interval try_make_timestamp try_make_timestamp_ltz
try_make_timestamp_ntz try_mod try_multiply try_parse_json try_parse_url
try_subtract try_to_binary try_to_date try_to_number try_to_time try_to_timestamp
try_url_decode try_validate_utf8 try_variant_get tuple_difference_double
tuple_difference_integer tuple_difference_theta_double
tuple_difference_theta_integer tuple_intersection_double tuple_intersection_integer
tuple_intersection_theta_double tuple_intersection_theta_integer
tuple_sketch_estimate_double tuple_sketch_estimate_integer
tuple_sketch_summary_double tuple_sketch_summary_integer tuple_sketch_theta_double
tuple_sketch_theta_integer tuple_union_double tuple_union_integer
tuple_union_theta_double tuple_union_theta_integer typeof ucase unbase64 unhex
unix_date unix_micros unix_millis unix_seconds unix_timestamp upper url_decode
url_encode validate_utf8 variant_get vector_cosine_similarity vector_inner_product
vector_l2_distance vector_norm vector_normalize weekday weekofyear when width_bucket
xpath xpath_boolean xpath_double xpath_float xpath_int xpath_long xpath_number
xpath_short xpath_string xxhash64 year zeroifnull zip_with | || ~
"""
)
# Not one value per record: Spark's analysed plan refuses them (``analyser.resolve``).
NOT_PER_RECORD = _names(
    """
any any_value approx_count_distinct approx_percentile approx_top_k
approx_top_k_accumulate approx_top_k_combine array_agg avg bit_and bit_or bit_xor
bitmap_and_agg bitmap_construct_agg bitmap_or_agg bool_and bool_or collations
collect_list collect_set corr count count_if count_min_sketch covar_pop covar_samp
cume_dist dense_rank every explode explode_outer first first_value grouping
grouping_id histogram_numeric hll_sketch_agg hll_union_agg inline inline_outer
json_tuple kll_merge_agg_bigint kll_merge_agg_double kll_merge_agg_float
kll_sketch_agg_bigint kll_sketch_agg_double kll_sketch_agg_float kurtosis lag last
last_value lead listagg max max_by mean measure median min min_by mode nth_value
ntile percent_rank percentile percentile_approx percentile_cont percentile_disc
posexplode posexplode_outer python_worker_logs range rank regr_avgx regr_avgy
regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy row_number
schema_of_variant_agg session_window skewness some sql_keywords stack std stddev
stddev_pop stddev_samp string_agg sum table_changes table_changes_by_path
theta_intersection_agg theta_sketch_agg theta_union_agg try_avg try_sum
tuple_intersection_agg_double tuple_intersection_agg_integer tuple_sketch_agg_double
tuple_sketch_agg_integer tuple_union_agg_double tuple_union_agg_integer var_pop
var_samp variance variant_explode variant_explode_outer vector_avg vector_sum window
window_time
"""
)
# Deterministic to Spark, but the session's or the clock's: refused on Spark's tree.
CLOCK_OR_SESSION = frozenset({"current_path"})
REFUSED_BY_NAME = sql_text.OUTSIDE_SQL | sql_text.NOT_REPLAYABLE
CLASSIFIED = PER_RECORD | NOT_PER_RECORD | CLOCK_OR_SESSION | REFUSED_BY_NAME
# The Spark whose registry holds every function a pipeline may call (checked
# against its ``SHOW SYSTEM FUNCTIONS`` by tests/integration/test_clock_refusals.py):
# on it, an expression that calls only these needs no look at the registry (0.7 s
# of a cold run's start). Any other call is looked up, and refused if not there
# (Delta's ``table_changes`` is not Spark's own).
REVIEWED_SPARK = "4.2.0"
IN_REGISTRY = PER_RECORD | CLOCK_OR_SESSION
