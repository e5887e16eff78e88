# embed_text.cmake: writes the bytes of a text file into a C header as a NUL-terminated array,
# so a binary can write the file out without it being installed beside the binary.
#   cmake -DIN=FILE -DOUT=HEADER -DNAME=SYMBOL -P embed_text.cmake
# HEADER defines: static const unsigned char SYMBOL[] = {...bytes..., 0};
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n" bytes "${bytes}")
get_filename_component(src "${IN}" NAME)
file(WRITE "${OUT}.tmp" "/* generated from ${src} by cmake/embed_text.cmake: edit ${src} */\n"
     "static const unsigned char ${NAME}[] = {\n${bytes}0x00};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
