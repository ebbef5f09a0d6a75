;;; magent-store-values-tests.el --- Values encoded as magent encodes them  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; How `magent-store-mode' turns what magent holds into JSON text.  The
;; mapping used when the loaded magent lacks `magent-json-safe-value' is
;; judged by upstream magent's own `magent-json-safe-value', shape by
;; shape, through `json-serialize'.  What JSON (or this Emacs's reader)
;; cannot hold is replaced in its most faithful form: every character
;; JSON holds kept, integers kept as long as this Emacs reads them back,
;; and only what was replaced noted for `magent-store-status'.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-magent-tests)
(require 'magent-json)

(defun magent-store-values-test--serialized (convert value)
  "VALUE made encodable by CONVERT, as JSON text; or the error's symbol."
  (condition-case err
      (magent-store-json-serialize (funcall convert value))
    (error (car err))))

(defun magent-store-values-test--shapes ()
  "Shapes magent may hold, the awkward ones its conversion tells apart."
  (let ((marker (with-current-buffer (get-buffer-create " *magent-store-values*")
                  (point-marker))))
    (append
     (magent-store-magent-test--shapes)
     (list
      ;; Lists whose entries are lists, one headed by a keyword.
      '((:a 1) (b 2))
      '((a 1) (:b 2))
      '((a 1) "not a pair")
      '(nil 1)
      '(nil)
      '((nil . 1))
      '((1 . "number key") ("s" . sym))
      ;; Plists, whole and not.
      '(:a 1 :b)
      '(:a (:b (:c nil)))
      '(:a 1 b 2)
      ;; Objects that are not lists at all.
      (get-buffer-create " *magent-store-values*")
      marker
      (make-magent-store-magent-test--record :a '(x . y) :b [1])
      (symbol-function 'car)
      (make-bool-vector 3 t)
      (list 'quote 'x)
      (vector '((k . v)) '(:p 1) '(1 2))))))

(ert-deftest magent-store-values-fallback-encodes-every-shape-as-magent ()
  "Without magent's `magent-json-safe-value', every shape is encoded as
magent's own function encodes it, down to which shapes are objects."
  (dolist (value (magent-store-values-test--shapes))
    (ert-info ((format "shape %S" value))
      (let ((magent (magent-store-values-test--serialized
                     #'magent-json-safe-value value)))
        (should (stringp magent))
        (should (equal (magent-store-values-test--serialized
                        #'magent-store-magent--safe-value-1 value)
                       magent))))))

(ert-deftest magent-store-values-fallback-stores-a-dotted-list-as-printed ()
  "A dotted list, which magent's conversion cannot take, is stored by the
fallback as its printed form, wherever it is nested."
  (dolist (value (list '(1 . 2) '(a b . c) '((k 1 . 2)) (vector '(x . y))))
    (ert-info ((format "value %S" value))
      (should (symbolp (magent-store-values-test--serialized
                        #'magent-json-safe-value value)))))
  (should (equal (magent-store-values-test--serialized
                  #'magent-store-magent--safe-value-1
                  (list '(1 . 2) '(a b . c) '((k 1 . 2)) (vector '(x . y))))
                 "[\"(1 . 2)\",\"(a b . c)\",{\"k\":\"(1 . 2)\"},[\"(x . y)\"]]")))

(defmacro magent-store-values-test--noting (&rest body)
  "Run BODY with no value noted yet; return what BODY returns."
  (declare (indent 0) (debug t))
  `(let ((magent-store-magent--unencodable nil))
     (cl-letf (((symbol-function 'message) #'ignore))
       ,@body)))

(defun magent-store-values-test--read (text)
  "Read the JSON TEXT the store would write, as this Emacs reads it back."
  (json-parse-string text :object-type 'alist :array-type 'array
                     :null-object nil
                     :false-object :json-false))

(ert-deftest magent-store-values-every-character-json-holds-is-kept ()
  "Beside a value JSON cannot hold, a string keeps every character JSON
holds, U+10FFFF too; a string already of characters is not read again
as UTF-8: each raw byte in it becomes U+FFFD, even bytes that would
spell a character."
  (magent-store-values-test--noting
    (should (equal (magent-store-values-test--read
                    (magent-store-magent--encode
                     (vector 0.0e+NaN
                             (string #x10FFFF ?a #xFFFF)
                             (string ?é #x3FFFC3 #x3FFFA9 ?z)
                             (string #x110000 ?b)
                             (encode-coding-string "unibyte é" 'utf-8))))
                   (vector "0.0e+NaN"
                           (string #x10FFFF ?a #xFFFF)
                           "é\ufffd\ufffdz"
                           "\ufffdb"
                           "unibyte é")))))

(ert-deftest magent-store-values-only-what-is-replaced-is-noted ()
  "Strings, keys and integers JSON holds, beside a NaN, are kept and not
noted: only the NaN is."
  (magent-store-values-test--noting
    (should (equal (magent-store-values-test--read
                    (magent-store-magent--encode
                     (list :plain "plain text, é" :n 42 :negative -7
                           :nested '((key . "value")) :nan 0.0e+NaN)))
                   '((plain . "plain text, é") (n . 42) (negative . -7)
                     (nested . ((key . "value"))) (nan . "0.0e+NaN"))))
    (should (equal (mapcar #'car magent-store-magent--unencodable)
                   '("a NaN or infinite number")))))

(ert-deftest magent-store-values-integers-are-kept-to-64-bits ()
  "Beside a NaN, integers of 64 bits are kept, down to -2^63 and up to
2^63-1; one beyond is its digits where this Emacs cannot read it back."
  (let* ((max (1- (expt 2 63)))
         (min (- (expt 2 63)))
         (beyond (list (1+ max) (1- min) (expt 2 70))))
    (magent-store-values-test--noting
      (should (equal (magent-store-values-test--read
                      (magent-store-magent--encode
                       (vconcat (list 0.0e+NaN 0 max min (1- max) (1+ min))
                                beyond)))
                     (vconcat (list "0.0e+NaN" 0 max min (1- max) (1+ min))
                              (if magent-store-magent--reader-refuses-bignum
                                  (mapcar #'number-to-string beyond)
                                beyond))))
      (should (equal (mapcar #'car magent-store-magent--unencodable)
                     (if magent-store-magent--reader-refuses-bignum
                         '("an integer beyond 64 bits" "a NaN or infinite number")
                       '("a NaN or infinite number")))))))

(ert-deftest magent-store-values-a-nul-is-stored-as-this-emacs-reads-it ()
  "A NUL, which JSON holds, is kept where this Emacs reads it back; where
it cannot, the text holds U+FFFD in its place and the NUL is noted."
  (magent-store-values-test--noting
    (let ((text (magent-store-magent--encode (vector "nul \0 end" "plain"))))
      (should (equal (magent-store-values-test--read text)
                     (if magent-store-magent--reader-refuses-nul
                         ["nul \ufffd end" "plain"]
                       ["nul \0 end" "plain"])))
      (should (equal (mapcar #'car magent-store-magent--unencodable)
                     (and magent-store-magent--reader-refuses-nul
                          '("a NUL character")))))))

(provide 'magent-store-values-tests)
;;; magent-store-values-tests.el ends here
